"""The driver starter: the one path (enqueue wake-up, start-up, redrive) that starts a delivery."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import timedelta

from opentelemetry import trace
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities.driver import dispatch_plan
from activities.names import JOB_DRIVER_WORKFLOW
from receipts import deliveries, fairness, metric_counts, metrics
from receipts import operations as ops
from receipts.deliveries import (
    MAX_GENERATION,
    driver_workflow_id,
    generation_exhausted_message,
)
from receipts.jobs import Job
from receipts.kinds import QUEUE_DRIVER
from receipts.messages import DriverInput, DriverPlan
from receipts.plan import Step, next_step
from receipts.refusal_log import RefusalLog
from receipts.settings import Settings
from receipts.store import Store
from receipts.timing import JobTiming, TimingSettings, derive
from roles.infra.tracing import attach_traceparent, detach, job_trace
from workflows.driver import SUMMARY_BYTES, bounded, search_attributes

log = logging.getLogger("roles.delivery.starter")
_tracer = trace.get_tracer("receipt.starter")

ACTIVE_DELIVERY = "active_delivery"
HELD_BACK = "held_back"
NOT_AVAILABLE = "not_available"


@dataclass(frozen=True, slots=True)
class StartResult:
    """`created` when a driver was started; otherwise `reason` says why not."""

    created: bool
    reason: str | None = None
    workflow_id: str | None = None
    generation: int | None = None
    # The first workflow task went straight to this process's driver worker (eager start).
    eager: bool = False


class DriverStarter:
    """Starts `JobDriver` generation g+1 only when generation g's driver is closed.

    A driver carries its attempts as activities, so an open driver is an active delivery and a
    closed one has none left running that could settle for it (an attempt child left by an
    older build is fenced like any other delivery: it cannot settle a newer attempt).
    """

    def __init__(
        self,
        client: Client,
        store: Store,
        settings: Settings,
        timing: TimingSettings,
        *,
        plan_first_run: bool = False,
        eager_start: bool = False,
    ) -> None:
        self.client = client
        self.store = store
        self.settings = settings
        self.timing = timing
        # Only a starter in the process that also runs the driver workflow (its dispatcher)
        # may plan the first run: the plan's queue and timings must be the ones the driver's
        # own `prepare_delivery` would derive from the same settings.
        self.plan_first_run = plan_first_run
        self.held_log = RefusalLog()
        # Beside a driver worker on the same client, a start may hand the first workflow task
        # straight to it (Temporal's eager workflow start): no task-queue round trip, less of
        # the server's CPU per job (docs/design.md §6). Without a free local slot the SDK asks
        # for a plain start; a driver that dies holding an eager task delays it by the
        # workflow task timeout (10 s), as with any task it polled.
        self.eager_start = eager_start

    async def start(self, job_id: str) -> StartResult:
        """Start the next delivery generation of a job, or say why nothing was started.

        An open driver → `{created: False, reason: "active_delivery"}`; past 32
        generations the job is failed non-retryably with `delivery recovery exceeded 32
        generations for <jobId>`. A job whose organization holds every dispatch slot it may on
        the job's worker queue → `held_back` (it stays queued: the dispatcher starts it when a
        slot is given back, the redrive at the latest); a job not available yet →
        `not_available` until its `availableAt`.
        """
        try:
            result = await self._start(job_id)
        except asyncio.CancelledError:
            raise
        except Exception:
            metric_counts.driver_started("failed", None)  # the caller logs it; the redrive retries
            raise
        metric_counts.driver_started(result.reason or "created", result.generation)
        return result

    async def _start(self, job_id: str) -> StartResult:
        job, latest, now = await deliveries.job_and_latest(self.store, job_id)
        if gone := _gone(job):
            return StartResult(False, gone)
        assert job is not None
        generation = 0
        if latest is not None:
            if await self._is_open(latest.workflow_id):
                return StartResult(False, ACTIVE_DELIVERY, latest.workflow_id, latest.generation)
            if gone := await self._settled_meanwhile(job_id):
                return StartResult(False, gone)
            generation = latest.generation + 1
        plan = next_step(job, now)
        if plan.step is Step.NOT_AVAILABLE:
            # No driver waits out the delay holding a slot: the dispatcher starts the job when
            # the database clock reaches `availableAt` (the redrive at the latest).
            return StartResult(False, NOT_AVAILABLE)
        share = fairness.share_of(job, self.settings) if plan.step is Step.DELIVER else None
        if share is not None:
            plan = await fairness.claim(self.store, job, now, *share)
            if plan.step is Step.HELD:
                self._held_back(job, *share)
                return StartResult(False, HELD_BACK)
        timing = derive(job.agent_id, job.payload, self.timing)
        while True:
            if generation >= MAX_GENERATION:  # generations 0..31: 32 in all
                message = generation_exhausted_message(job_id)
                out = await ops.fail_undeliverable(self.store, job_id, error=message)
                log.error(
                    message,
                    extra={
                        "event": "delivery.generations_exhausted",
                        "jobId": job_id,
                        "status": out.status,
                    },
                )
                return StartResult(False, "generations_exhausted", None, MAX_GENERATION)
            workflow_id = driver_workflow_id(job_id, generation)
            token = attach_traceparent(job.traceparent)
            try:
                with _tracer.start_as_current_span(
                    "receipt.dispatch",
                    attributes={"receipt.job_id": job_id, "receipt.generation": generation},
                ):
                    run_id, eager = await self._start_driver(job, workflow_id, generation, timing)
            except WorkflowAlreadyStartedError:
                if await self._is_open(workflow_id):
                    await deliveries.record(self.store, job_id, generation)
                    return StartResult(False, ACTIVE_DELIVERY, workflow_id, generation)
                # Closed but unrecorded (the bookkeeping was lost, or another starter's, which
                # may have delivered the job meanwhile): advance past it.
                if gone := await self._settled_meanwhile(job_id):
                    return StartResult(False, gone, workflow_id, generation)
                generation += 1
                continue
            except Exception:
                # A slot taken for this start is given back when nothing was started (the job
                # takes one again when a start succeeds), not held by a job nothing delivers; a
                # start whose answer was lost may have started the driver: it keeps the slot.
                if share is not None and not await self._started_anyway(workflow_id):
                    await fairness.release(self.store, job_id)
                raise
            finally:
                detach(token)
            # Bookkeeping (receipts/bookkeeping.py): the ledger row is queued, and the generation
            # record written at once with it, one round trip for both.
            deliveries.ledger_workflow(
                self.store,
                workflow_id=workflow_id,
                run_id=run_id,
                job_id=job_id,
                kind=job.kind,
                temporal_type=JOB_DRIVER_WORKFLOW,
                task_queue=self.settings.queue(QUEUE_DRIVER),
                status="running",
            )
            await deliveries.record(self.store, job_id, generation)
            # A job's own story at INFO is two lines (`api.enqueued`, `attempt.settled`); a
            # first start is DEBUG, a later generation (a redelivery) INFO. In the job's trace,
            # as every line about a job (roles/infra/logs.py).
            with job_trace(job.traceparent):
                log.log(
                    logging.INFO if generation else logging.DEBUG,
                    "driver started",
                    extra={
                        "event": "delivery.started",
                        "jobId": job_id,
                        "workflowId": workflow_id,
                        "generation": generation,
                        "eager": eager,
                    },
                )
            return StartResult(True, None, workflow_id, generation, eager)

    def _held_back(self, job: Job, queue: str, cap: int) -> None:
        # Counted every time; logged once in a while per organization and queue: a backlog past
        # the cap is the fair share working, not one line per job held.
        metrics.HELD_BACK.labels(queue).inc()
        unlogged = self.held_log.due(queue, job.organization_id or "")
        if unlogged is None:
            return
        log.info(
            "job held back: its organization holds every dispatch slot it may on the queue",
            extra={
                "event": "delivery.held_back",
                "jobId": job.job_id,
                "organizationId": job.organization_id,
                "queue": queue,
                "cap": cap,
                "unloggedSince": unlogged,
            },
        )

    async def _start_driver(
        self, job: Job, workflow_id: str, generation: int, timing: JobTiming
    ) -> tuple[str, bool]:
        """Start the driver run; return its run id and whether it was started eagerly."""
        handle = await self.client.start_workflow(
            JOB_DRIVER_WORKFLOW,
            DriverInput(
                job_id=job.job_id,
                generation=generation,
                callbacks=bool(self.settings.callback_urls),
                dispatched_beside=True,
                deliveries=self.settings.deliveries_per_attempt,
                plan=self._plan(job, timing),
            ),
            id=workflow_id,
            task_queue=self.settings.queue(QUEUE_DRIVER),
            run_timeout=timedelta(milliseconds=timing.driver_timeout_ms),
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            search_attributes=search_attributes(
                job.job_id, job.agent_id, job.lane, job.kind, job.organization_id
            ),
            static_summary=(
                f"deliver {bounded(job.agent_id, SUMMARY_BYTES)} {job.kind} "
                f"(generation {generation})"
            ),
            request_eager_start=self.eager_start,
        )
        return handle.result_run_id or "", _eagerly_started(handle)

    def _plan(self, job: Job, timing: JobTiming) -> DriverPlan | None:
        """The first run's plan when this starter may plan and the job just read is plainly
        deliverable (queued, no abort, no `availableAt`); otherwise None, and the driver reads
        the job itself. The attempt's lease re-checks all of it under the fence, so a plan gone
        stale in between is refused there, never acted on. Not with callbacks: their driver
        reads the job itself first, so no `dispatched` post is made for a job that read found
        settled."""
        if not self.plan_first_run or self.settings.callback_urls:
            return None
        # No clock was read: a job with any `availableAt` is left to the driver's own read.
        if next_step(job, None).step is not Step.DELIVER:
            return None
        return dispatch_plan(job, self.settings, timing)

    async def _settled_meanwhile(self, job_id: str) -> str | None:
        """`terminal` (or `missing`) when the job, read before a driver of it was found closed,
        is settled (or gone) now: that driver may have settled it as it closed, and the read from
        before still said running (a driver was then started for a settled job)."""
        return _gone((await deliveries.job_and_latest(self.store, job_id))[0])

    async def _started_anyway(self, workflow_id: str) -> bool:
        """Whether a start that raised left its driver open all the same (True, too, when
        Temporal cannot say: the slot is kept, and the job's settle gives it back)."""
        try:
            return await self._is_open(workflow_id)
        except Exception:
            return True

    async def _is_open(self, workflow_id: str) -> bool:
        try:
            description = await self.client.get_workflow_handle(workflow_id).describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        return description.status == WorkflowExecutionStatus.RUNNING


def _gone(job: Job | None) -> str | None:
    """Why no driver is started for `job` as read: `missing`, `terminal`; None when it may be."""
    if job is None:
        return "missing"
    return "terminal" if job.terminal else None


def _eagerly_started(handle: object) -> bool:
    """Whether the server handed the start's first task to a local worker: for the log and the
    tests only, never for a decision. The SDK (1.35) marks the handle with a private attribute;
    a release that renames it makes this read False, which the eager-start test notices."""
    return bool(getattr(handle, "__temporal_eagerly_started", False))
