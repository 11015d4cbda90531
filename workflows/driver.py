"""`JobDriverWorkflow`: carry one job to a worker, one attempt child at a time. It never leases."""

from __future__ import annotations

from datetime import timedelta
from typing import NoReturn

from temporalio import workflow
from temporalio.common import (
    RetryPolicy,
    SearchAttributeKey,
    SearchAttributePair,
    TypedSearchAttributes,
)
from temporalio.exceptions import ActivityError, ChildWorkflowError, WorkflowAlreadyStartedError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from receipts.messages import (
        ABORTED,
        ACTIVE,
        DISPATCH,
        NOT_AVAILABLE,
        STALE_FAILED,
        TERMINAL,
        AttemptInput,
        AttemptResult,
        CallbackRequest,
        DriverInput,
        DriverPlan,
    )

JOB_ID = SearchAttributeKey.for_keyword("ReceiptJobId")
AGENT_ID = SearchAttributeKey.for_keyword("ReceiptAgentId")
LANE = SearchAttributeKey.for_keyword("ReceiptLane")
KIND = SearchAttributeKey.for_keyword("ReceiptKind")
SEARCH_ATTRIBUTES = (JOB_ID, AGENT_ID, LANE, KIND)

TERMINAL_STATUSES = ("completed", "failed", "canceled")
# Patient enough to ride out a database restart (about a minute of retries).
PREPARE_RETRY = RetryPolicy(
    maximum_attempts=12,
    initial_interval=timedelta(milliseconds=200),
    maximum_interval=timedelta(seconds=10),
)
# Bounds a prepare whose task was lost inside Temporal (start-to-close never starts): the
# driver then fails, and the redrive starts the next generation from the receipts.
PREPARE_SCHEDULE_TO_CLOSE = timedelta(minutes=3)
CALLBACK_RETRY = RetryPolicy(maximum_attempts=2, initial_interval=timedelta(seconds=1))
ACTIVE_POLL = timedelta(seconds=1)


def search_attributes(job_id: str, agent_id: str, lane: str, kind: str) -> TypedSearchAttributes:
    """The four Receipt search attributes, so the Temporal UI finds every delivery of a job."""
    return TypedSearchAttributes(
        [
            SearchAttributePair(JOB_ID, job_id),
            SearchAttributePair(AGENT_ID, agent_id),
            SearchAttributePair(LANE, lane),
            SearchAttributePair(KIND, kind),
        ]
    )


def attempt_workflow_id(job_id: str, attempt: int) -> str:
    """`<jobId>:attempt:<n>` — the attempt child's id."""
    return f"{job_id}:attempt:{attempt}"


@workflow.defn(name="JobDriverWorkflow")
class JobDriverWorkflow:
    """Read the job, fail a stale lease, honour an abort, start attempt `n`, post callbacks.

    After an attempt that left the job queued (a retryable failure) the driver continues as new
    and delivers the next attempt; after one that left it leased (every delivery died) it waits
    for the lease to go stale and fails it, so nothing depends on a process remembering the job.
    """

    @workflow.run
    async def run(self, request: DriverInput) -> str:
        # The first run may carry the starter's read of the job (a queued, deliverable job);
        # every other run reads it through `prepare_delivery`.
        plan = request.plan or await self._prepare(request)
        if plan.action == TERMINAL:
            await self._callback(request, plan.job_status)
            return plan.job_status
        if plan.action == ABORTED:
            await self._callback(request, plan.job_status)
            return "canceled"
        if plan.action in (ACTIVE, NOT_AVAILABLE):
            # Sleep at most a minute per run: continue-as-new renews the run timeout.
            await workflow.sleep(timedelta(milliseconds=min(max(plan.wait_ms, 100), 60_000)))
            self._continue(request, plan)
        if plan.action == STALE_FAILED:
            if plan.job_status in TERMINAL_STATUSES:
                await self._callback(request, plan.job_status)
                return plan.job_status
            self._continue(request, plan)
        if plan.action != DISPATCH:
            return plan.action

        if not request.dispatched_posted:
            await self._callback(request, "dispatched")
            request.dispatched_posted = True
        attempt = AttemptInput(
            job_id=request.job_id,
            attempt=plan.attempt,
            agent_id=plan.agent_id,
            kind=plan.kind,
            lane=plan.lane,
            lease_ms=plan.lease_ms,
            execution_timeout_ms=plan.execution_timeout_ms,
            heartbeat_ms=plan.heartbeat_ms,
            deliveries=request.deliveries,
        )
        try:
            result: AttemptResult = await workflow.execute_child_workflow(
                "JobAttemptWorkflow",
                attempt,
                id=attempt_workflow_id(request.job_id, plan.attempt),
                task_queue=plan.task_queue,
                parent_close_policy=ParentClosePolicy.ABANDON,
                search_attributes=search_attributes(
                    request.job_id, plan.agent_id, plan.lane, plan.kind
                ),
                static_summary=f"{plan.agent_id} {plan.kind} attempt {plan.attempt}",
                result_type=AttemptResult,
            )
        except WorkflowAlreadyStartedError:
            # An attempt child with this id is still open (an earlier generation's): wait.
            await workflow.sleep(timedelta(milliseconds=plan.heartbeat_ms))
            self._continue(request, plan)
            raise
        except ChildWorkflowError:
            result = AttemptResult("lease_lost", error="attempt child did not complete")
        if result.job_status in TERMINAL_STATUSES:
            await self._callback(request, result.job_status)
            return result.job_status
        self._continue(request, plan)
        raise AssertionError("unreachable: continue-as-new raises")

    async def _prepare(self, request: DriverInput) -> DriverPlan:
        # A local activity: the read runs in this worker's process with no activity task and
        # no second workflow task (enqueue→leased p50 84 → 69 ms in `make bench`).
        plan: DriverPlan = await workflow.execute_local_activity(
            "prepare_delivery",
            request.job_id,
            result_type=DriverPlan,
            start_to_close_timeout=timedelta(seconds=30),
            schedule_to_close_timeout=PREPARE_SCHEDULE_TO_CLOSE,
            retry_policy=PREPARE_RETRY,
        )
        return plan

    def _continue(self, request: DriverInput, plan: DriverPlan) -> NoReturn:
        request.plan = None  # every later run reads the job afresh
        run_timeout = (
            timedelta(milliseconds=plan.driver_timeout_ms) if plan.driver_timeout_ms else None
        )
        workflow.continue_as_new(request, run_timeout=run_timeout)

    async def _callback(self, request: DriverInput, event: str) -> None:
        if not request.callbacks or event not in ("dispatched", *TERMINAL_STATUSES):
            return
        try:
            await workflow.execute_activity(
                "post_callbacks",
                CallbackRequest(request.job_id, event),
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=CALLBACK_RETRY,
            )
        except ActivityError:
            workflow.logger.warning("callback activity failed", extra={"jobId": request.job_id})
