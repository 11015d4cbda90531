"""`JobDriver`: carry one job to a worker, one attempt activity at a time. It never leases.
(`JobDriverWorkflow`, the type of earlier builds, stays registered for the runs still open.)"""

from __future__ import annotations

import asyncio
import json
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
    from activities.names import (
        EXECUTE_ATTEMPT,
        JOB_ATTEMPT_WORKFLOW,
        JOB_DRIVER_WORKFLOW,
        LEGACY_JOB_DRIVER_WORKFLOW,
        POST_CALLBACKS,
        PREPARE_DELIVERY,
    )
    from receipts.deliveries import attempt_workflow_id
    from receipts.jobs import TERMINAL_STATUSES
    from receipts.messages import (
        AttemptInput,
        AttemptResult,
        AttemptStatus,
        CallbackRequest,
        DriverAction,
        DriverInput,
        DriverPlan,
    )
    from receipts.tenancy import caller_id

JOB_ID = SearchAttributeKey.for_keyword("ReceiptJobId")
AGENT_ID = SearchAttributeKey.for_keyword("ReceiptAgentId")
LANE = SearchAttributeKey.for_keyword("ReceiptLane")
KIND = SearchAttributeKey.for_keyword("ReceiptKind")
ORGANIZATION_ID = SearchAttributeKey.for_keyword("ReceiptOrganizationId")
SEARCH_ATTRIBUTES = (JOB_ID, AGENT_ID, LANE, KIND, ORGANIZATION_ID)

# Drivers of the legacy type (`JobDriverWorkflow`) recorded before this patch started each
# attempt as a `JobAttemptWorkflow` child and replay down that path; later ones took the patch.
# `JobDriver`, which every dispatch starts now, has no such branch, so no marker per run.
ATTEMPT_AS_ACTIVITY = "attempt-as-activity"
CALLBACK_EVENTS = frozenset({"dispatched", *TERMINAL_STATUSES})
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
# `dispatched` beside the attempt: the terminal post waits for it, so a driver killed mid-post
# has it retried within its heartbeat timeout (the retry takes its claim over), a few times.
DISPATCHED_RETRY = RetryPolicy(maximum_attempts=5, initial_interval=timedelta(seconds=1))
DISPATCHED_HEARTBEAT = timedelta(seconds=10)
# Time the attempt may spend around the handler: lease/start-fence, re-read, settle retries.
SETTLE_MARGIN = timedelta(seconds=30)
# The attempt ends this long before the driver's run would time out, so the driver itself sees
# how it ended (and continues as new) instead of closing with the attempt still scheduled.
RUN_END_MARGIN = timedelta(seconds=10)
MIN_ATTEMPT_WINDOW = timedelta(seconds=10)


# How much of a tenant's free text (an agent id, an organization id) Temporal is shown, counted
# as Temporal counts it: JSON-escaped, where a character outside ASCII is up to 12 bytes. A
# keyword search attribute over 2 048 such bytes is refused, and with it the driver's start (a
# 200-character agent id of emoji is 2 400); a summary is bounded too. Within this, any id of
# ASCII the API accepts (at most 200 characters) is shown whole.
SEARCHABLE_BYTES = 1_024
SUMMARY_BYTES = 256


def bounded(text: str, limit: int) -> str:
    """`text`, cut to its longest prefix whose JSON-escaped form is at most `limit` bytes (what
    Temporal shows of it; the receipts keep it whole)."""
    if len(json.dumps(text)) <= limit:
        return text
    size, end = 2, 0  # the quotes
    for end, char in enumerate(text):  # noqa: B007 (end is read after the loop)
        size += len(json.dumps(char)) - 2
        if size > limit - 6:  # room for the "…" (\u2026 escaped)
            break
    return text[:end] + "…"


def search_attributes(
    job_id: str, agent_id: str, lane: str, kind: str, organization_id: str | None = None
) -> TypedSearchAttributes:
    """The Receipt search attributes, so the Temporal UI finds every delivery of a job by the id
    its caller chose: `ReceiptJobId` is that id (the workflow id is the runtime's,
    `<id>~<organization tag>`) and `ReceiptOrganizationId` its organization. Free text is
    `bounded` to what Temporal takes."""
    pairs = [
        SearchAttributePair(JOB_ID, caller_id(job_id) if organization_id else job_id),
        SearchAttributePair(AGENT_ID, bounded(agent_id, SEARCHABLE_BYTES)),
        SearchAttributePair(LANE, lane),
        SearchAttributePair(KIND, kind),
    ]
    if organization_id:
        pairs.append(
            SearchAttributePair(ORGANIZATION_ID, bounded(organization_id, SEARCHABLE_BYTES))
        )
    return TypedSearchAttributes(pairs)


def attempt_activity_id(attempt: int) -> str:
    """`attempt:<n>` — the attempt activity's id within its driver run."""
    return f"attempt:{attempt}"


def attempt_summary(plan: DriverPlan) -> str:
    """What the Temporal UI shows for an attempt: `<agentId> <kind> attempt <n>`."""
    return f"{bounded(plan.agent_id, SUMMARY_BYTES)} {plan.kind} attempt {plan.attempt}"


def worker_lost_timeout(plan: DriverPlan) -> timedelta:
    """The attempt activity's heartbeat timeout: `RECEIPT_WORKER_LOST_TIMEOUT_MS`, or two
    receipt heartbeat cadences when that is sooner (a short lease), so Temporal redelivers a
    dead worker's attempt before its lease can expire and cost the job an attempt."""
    two_cadences = 2 * plan.heartbeat_ms
    lost_ms = plan.worker_lost_timeout_ms or two_cadences
    return timedelta(milliseconds=min(lost_ms, two_cadences))


class _Driver:
    """Read the job, fail a stale lease, honour an abort, run attempt `n`, post callbacks.

    The attempt is the `execute_attempt` activity on the job's routed task queue (activity id
    `attempt:<n>`): the worker leases, heartbeats, runs the handler and settles under the
    fence; Temporal redelivers it when its worker stops heartbeating. After an attempt that
    left the job queued (a retryable failure) the driver continues as new and delivers the next
    attempt; after one that left it leased (every delivery died) it waits for the lease to go
    stale and fails it, so nothing depends on a process remembering the job.
    """

    async def _drive(self, request: DriverInput) -> str:
        # The first run may carry the starter's read of the job (a queued, deliverable job);
        # every other run reads it through `prepare_delivery`.
        plan = request.plan or await self._prepare(request)
        if plan.action == DriverAction.TERMINAL:
            await self._callback(request, plan.job_status)
            return plan.job_status
        if plan.action == DriverAction.ABORTED:
            await self._callback(request, plan.job_status)
            return "canceled"
        if plan.action in (DriverAction.ACTIVE, DriverAction.NOT_AVAILABLE):
            # Sleep at most a minute per run: continue-as-new renews the run timeout.
            await workflow.sleep(timedelta(milliseconds=min(max(plan.wait_ms, 100), 60_000)))
            self._continue(request, plan)
        if plan.action == DriverAction.STALE_FAILED:
            if plan.job_status in TERMINAL_STATUSES:
                await self._callback(request, plan.job_status)
                return plan.job_status
            self._continue(request, plan)
        if plan.action != DriverAction.DISPATCH:
            return str(plan.action)

        dispatched = await self._post_dispatched(request)
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
        result = await self._run_attempt(request, plan, attempt)
        if dispatched is not None:
            await dispatched  # before the terminal post, and before a continue-as-new drops it
        if result.job_status in TERMINAL_STATUSES:
            await self._callback(request, result.job_status)
            return result.job_status
        self._continue(request, plan)

    async def _post_dispatched(self, request: DriverInput) -> asyncio.Task[None] | None:
        """Post `dispatched` once per job (the flag rides through continue-as-new). Beside the
        attempt when the run's input says so: a receiver slow to answer (three 5 s tries per
        URL) no longer holds the job's start, and the caller awaits the task before the
        terminal post or a continue-as-new, so the receiver still hears `dispatched` first (the
        recovery loop's terminal post waits too: receipts/sql/delivery.sql callbacks_owed).
        Runs recorded without `dispatched_beside` post it before the attempt."""
        if request.dispatched_posted:
            return None
        request.dispatched_posted = True
        if request.dispatched_beside and request.callbacks:
            return asyncio.create_task(self._callback(request, "dispatched", beside=True))
        await self._callback(request, "dispatched")
        return None

    async def _run_attempt(
        self, request: DriverInput, plan: DriverPlan, attempt: AttemptInput
    ) -> AttemptResult:
        return await self._attempt(plan, attempt)

    async def _attempt(self, plan: DriverPlan, attempt: AttemptInput) -> AttemptResult:
        """Run attempt `n` as the `execute_attempt` activity on the routed task queue."""
        try:
            result: AttemptResult = await workflow.execute_activity(
                EXECUTE_ATTEMPT,
                attempt,
                activity_id=attempt_activity_id(plan.attempt),
                task_queue=plan.task_queue,
                result_type=AttemptResult,
                start_to_close_timeout=timedelta(milliseconds=plan.lease_ms) + SETTLE_MARGIN,
                # No schedule-to-start bound: an attempt may wait for a worker to exist. The
                # whole attempt, every delivery included, is bounded by the driver's
                # invocation timeout (what is left of this run).
                schedule_to_close_timeout=self._attempt_window(plan),
                heartbeat_timeout=worker_lost_timeout(plan),
                retry_policy=RetryPolicy(
                    maximum_attempts=max(1, attempt.deliveries),
                    initial_interval=timedelta(milliseconds=200),
                    non_retryable_error_types=["NonRetryable"],
                ),
                summary=attempt_summary(plan),
            )
        except ActivityError as exc:
            # Every delivery died: the lease, if one was taken, stays until it expires; the
            # next run of this driver then requeues the job. Or the window closed on a live
            # delivery: it runs on under its lease, and the next run waits for it.
            return AttemptResult(
                AttemptStatus.LEASE_LOST,
                error=f"deliveries exhausted: {exc.cause or exc}",
                retryable=True,
            )
        return result

    def _attempt_window(self, plan: DriverPlan) -> timedelta:
        info = workflow.info()
        invocation = info.run_timeout or timedelta(milliseconds=plan.driver_timeout_ms)
        left = invocation - (workflow.now() - info.workflow_start_time) - RUN_END_MARGIN
        return max(MIN_ATTEMPT_WINDOW, left)

    async def _attempt_child(
        self, request: DriverInput, plan: DriverPlan, attempt: AttemptInput
    ) -> AttemptResult:
        """The path of drivers recorded before `ATTEMPT_AS_ACTIVITY`: replay only."""
        try:
            result: AttemptResult = await workflow.execute_child_workflow(
                JOB_ATTEMPT_WORKFLOW,
                attempt,
                id=attempt_workflow_id(request.job_id, plan.attempt),
                task_queue=plan.task_queue,
                parent_close_policy=ParentClosePolicy.ABANDON,
                search_attributes=search_attributes(
                    request.job_id, plan.agent_id, plan.lane, plan.kind
                ),
                static_summary=attempt_summary(plan),
                result_type=AttemptResult,
            )
        except WorkflowAlreadyStartedError:
            # An attempt child with this id is still open (an earlier generation's): wait.
            await workflow.sleep(timedelta(milliseconds=plan.heartbeat_ms))
            self._continue(request, plan)
        except ChildWorkflowError:
            result = AttemptResult(AttemptStatus.LEASE_LOST, error="attempt child did not complete")
        return result

    async def _prepare(self, request: DriverInput) -> DriverPlan:
        # A local activity: the read runs in this worker's process with no activity task and
        # no second workflow task (enqueue→leased p50 84 → 69 ms in `make bench`).
        plan: DriverPlan = await workflow.execute_local_activity(
            PREPARE_DELIVERY,
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

    async def _callback(self, request: DriverInput, event: str, *, beside: bool = False) -> None:
        if not request.callbacks or event not in CALLBACK_EVENTS:
            return
        try:
            await workflow.execute_activity(
                POST_CALLBACKS,
                CallbackRequest(request.job_id, event),
                start_to_close_timeout=timedelta(seconds=60),
                heartbeat_timeout=DISPATCHED_HEARTBEAT if beside else None,
                retry_policy=DISPATCHED_RETRY if beside else CALLBACK_RETRY,
            )
        except ActivityError:
            workflow.logger.warning(
                "callback activity failed",
                extra={
                    "event": "callback.activity_failed",
                    "jobId": request.job_id,
                    "callback": event,
                },
            )


@workflow.defn(name=JOB_DRIVER_WORKFLOW)
class JobDriver(_Driver):
    """The driver every dispatch starts: each attempt is the `execute_attempt` activity. No
    patch marker and no `TemporalChangeVersion` search attribute in its history."""

    @workflow.run
    async def run(self, request: DriverInput) -> str:
        return await self._drive(request)


@workflow.defn(name=LEGACY_JOB_DRIVER_WORKFLOW)
class JobDriverWorkflow(_Driver):
    """The driver type of builds before `JobDriver`, registered so that its open runs finish
    (they continue as new under this type): each attempt takes the `ATTEMPT_AS_ACTIVITY` patch
    (the activity) unless its history was recorded before it (a `JobAttemptWorkflow` child).
    Unregister it, with `JobAttemptWorkflow`, once no such driver can be open (README,
    "Upgrading")."""

    @workflow.run
    async def run(self, request: DriverInput) -> str:
        return await self._drive(request)

    async def _run_attempt(
        self, request: DriverInput, plan: DriverPlan, attempt: AttemptInput
    ) -> AttemptResult:
        if workflow.patched(ATTEMPT_AS_ACTIVITY):
            return await self._attempt(plan, attempt)
        return await self._attempt_child(request, plan, attempt)
