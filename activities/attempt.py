"""The attempt activity: lease (or start-fence), run the handler under heartbeats, then settle
(`activities/settle.py`); every write goes through the attempt's fence (`activities/fence.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from temporalio import activity

from activities.attempt_reach import (
    CutOff,
    TemporalReach,
    cut_off,
    temporal_heartbeats,
    until_cut_off,
)
from activities.attempt_watch import (
    TAKEOVER_GRACE_S,
    cancel_reason,
    taken_over,
    until_taken_over,
    watch_commands,
)
from activities.fence import AttemptFence
from activities.gateway import Gateway
from activities.handler_exits import Exits, handler_scope
from activities.handlers.context import (
    Handler,
    HandlerContext,
    HandlerSettings,
    no_handler_message,
)
from activities.handlers.fenced import FencedReceipts
from activities.names import EXECUTE_ATTEMPT
from activities.settle import REJECTED_STATUS, SHUTDOWN_ERROR, Settlement, rejected
from receipts import deliveries, delivery_ids, metric_counts, metrics
from receipts import operations as ops
from receipts.jobs import Job, job_stream
from receipts.listen import Listener
from receipts.messages import AttemptInput, AttemptResult, AttemptStatus
from receipts.notices import COMMANDS
from receipts.store import Store
from receipts.trace_context import job_trace
from receipts.waits import within

log = logging.getLogger("activities.attempt")
_tracer = trace.get_tracer("receipt.attempt")

ABORT_GRACE_S = 5.0
# A cancelled handler (an abort past its grace, a lost lease, the execution timeout, the
# worker's shutdown) gets this long to end before the attempt goes on without it: a handler
# that swallows its cancellation must not hold the attempt, its slot and the worker's shutdown
# for ever. What it does after that is fenced out (the attempt has settled or let go).
HANDLER_CANCEL_S = 5.0
# Handlers that outlived their cancellation, kept referenced until they end.
_abandoned: set[asyncio.Task[Any]] = set()


def execution_timeout_message(timeout_ms: int) -> str:
    """The error of a handler that ran past its execution timeout."""
    return f"execution timed out after {timeout_ms} ms"


def process_identity(role: str) -> dict[str, Any]:
    """The process identity recorded beside a lease: host, pid, role."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "role": role}


class AttemptActivities:
    """Holds what the attempt activity needs: the store, the handler registry and the settings
    handed to every handler, the listener, the process's AI gateway (if it runs one)."""

    def __init__(
        self,
        store: Store,
        handlers: Mapping[str, Handler],
        *,
        settings: HandlerSettings | None = None,
        role: str = "worker",
        listener: Listener | None = None,
        gateway: Gateway | None = None,
    ) -> None:
        self.store = store
        self.handlers = handlers
        self.settings = settings or HandlerSettings()
        self.role = role
        self.listener = listener
        self.gateway = gateway
        # When Temporal last answered this process (made at the first attempt with a client).
        self.reach: TemporalReach | None = None
        for outcome in ("unreadable", "taken_over"):
            metrics.ATTEMPTS_CUT_OFF.labels(outcome)
        # Each agent's series from the start, at 0: an alert on its increase sees the first one.
        for agent_id in (*handlers, metrics.OTHER_AGENT):
            metrics.HANDLERS_ABANDONED.labels(metrics.agent_label(agent_id))
            metrics.HANDLER_PROGRESS_UNWRITTEN.labels(metrics.agent_label(agent_id))
            for status in ("completed", "failed", "canceled"):
                metrics.JOBS_FINISHED.labels(metrics.agent_label(agent_id), status)

    @activity.defn(name=EXECUTE_ATTEMPT)
    async def execute_attempt(self, attempt: AttemptInput) -> AttemptResult:
        """Lease or start-fence, check abort, run the handler racing heartbeats and the
        execution timeout, then settle under the fence. Returns the attempt's result status."""
        info = activity.info()
        delivered = time.monotonic()
        worker_id = delivery_ids.delivery_id(
            attempt.job_id, attempt.attempt, info.workflow_run_id or "", info.attempt
        )
        ledger = functools.partial(
            deliveries.ledger_activity,
            self.store,
            workflow_id=info.workflow_id or "",
            activity_id=info.activity_id,
            attempt=info.attempt,
            job_id=attempt.job_id,
            kind=attempt.kind,
            activity=EXECUTE_ATTEMPT,
            worker_id=worker_id,
        )
        alive = asyncio.create_task(
            temporal_heartbeats(info.heartbeat_timeout, self._beat_details(worker_id)),
            name=f"temporal-heartbeats:{worker_id}",
        )
        ledger(status="started")  # queued to the bookkeeping writer: no round trip here
        try:
            result = await self._detachable(attempt, worker_id, delivered)
        finally:
            await _cancel(alive)
        ledger(status=result.status, detail={"jobStatus": result.job_status, "error": result.error})
        return result

    async def _detachable(
        self, attempt: AttemptInput, worker_id: str, delivered: float
    ) -> AttemptResult:
        """The attempt (`_execute`), which Temporal's cancelling it does not stop unless this
        worker shuts down.

        The activity's cancellation for any other reason (`not_found`: its schedule-to-close,
        the driver's window, closed, or the driver's run ended; an attempt that waited long for
        a worker, or a redelivery, starts late in it) leaves the delivery holding the job's
        lease: the attempt runs on to its end or its execution timeout and settles through the
        fence, and the driver's next run waits for it on the receipts (a live lease; its stale
        rule covers this worker's death). Cancelling the handler there left the job leased to
        nobody until its lease expired, and cost it an attempt; a cancellation that came during
        the lease or the settle did the same. Detached, the attempt still ends at once when
        this worker shuts down (the job is released, as a shut-down attempt is) or when another
        delivery takes the lease over (Temporal redelivered it: looked for every
        `TAKEOVER_CHECK_S`, so two handlers never run on for a lease cadence)."""
        running = asyncio.create_task(
            self._execute(attempt, worker_id, delivered), name=f"attempt:{worker_id}"
        )
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            if activity.is_worker_shutdown():
                await _cancel(running)  # its own shutdown path releases the job
                raise
        current = asyncio.current_task()
        assert current is not None
        current.uncancel()  # the rest of the attempt runs as if never cancelled
        fence = AttemptFence(self.store, attempt.job_id, attempt.attempt, worker_id)
        reason = cancel_reason(activity.cancellation_details())
        metrics.ATTEMPTS_DETACHED.labels(reason).inc()
        _log(
            logging.WARNING,
            "Temporal cancelled the attempt; it runs on under its lease",
            "attempt.detached",
            fence,
            reason=reason,
        )
        shutdown = asyncio.create_task(activity.wait_for_worker_shutdown())
        taken = asyncio.create_task(until_taken_over(fence))
        try:
            try:
                done, _ = await asyncio.wait(
                    {running, shutdown, taken}, return_when=asyncio.FIRST_COMPLETED
                )
            except asyncio.CancelledError:  # cancelled again (the worker's shutdown past its grace)
                await _cancel(running)  # stops the handler; at shutdown, releases the job
                raise
            if running in done:
                return running.result()
            await _cancel(running)  # stops the handler; at shutdown, releases the job
            if shutdown in done:
                raise asyncio.CancelledError
            _log(
                logging.WARNING,
                "another delivery took the detached attempt over; handler stopped",
                "attempt.lease_lost",
                fence,
                status=AttemptStatus.LEASE_LOST,
            )
            return AttemptResult(
                AttemptStatus.LEASE_LOST, worker_id=worker_id, error="taken over by a redelivery"
            )
        finally:
            await _cancel(shutdown)
            await _cancel(taken)

    def _beat_details(self, worker_id: str) -> dict[str, Any]:
        """What the Temporal UI shows as the attempt's last heartbeat: which delivery, where."""
        return {"workerId": worker_id, **process_identity(self.role)}

    def _watch_reach(self, fence: AttemptFence, delivered: float) -> asyncio.Task[Any] | None:
        """Watch whether Temporal still answers this worker (`activities/attempt_reach.py`);
        None without a heartbeat timeout or a client (no redelivery to be stopped before)."""
        timeout = activity.info().heartbeat_timeout
        if timeout is None:
            return None
        if self.reach is None:
            try:
                self.reach = TemporalReach(activity.client())
            except RuntimeError:  # an ActivityEnvironment's activity: no client
                return None
        watch = until_cut_off(self.reach, fence, delivered, timeout.total_seconds())
        return asyncio.create_task(watch, name=f"reach:{fence.worker_id}")

    async def _execute(
        self, attempt: AttemptInput, worker_id: str, delivered: float
    ) -> AttemptResult:
        fence = AttemptFence(self.store, attempt.job_id, attempt.attempt, worker_id)
        settle = Settlement(fence)
        # One transaction: lease a queued job with its first heartbeat (→ running), or take a
        # redelivered attempt's lease over with a start-fence heartbeat.
        out = await fence.start(attempt.lease_ms, process_identity(self.role))
        if not out.ok or out.job is None:
            if out.status == ops.NOT_FOUND:
                return AttemptResult(
                    AttemptStatus.STALE_ATTEMPT, error="job not found", worker_id=worker_id
                )
            return rejected(out.status, out.job, worker_id)
        job = out.job
        # The rest of the attempt (handler, heartbeats, settle, their log lines) is one span in
        # the job's trace: carried by Temporal's interceptor, or attached from the job.
        with (
            job_trace(job.traceparent),
            _tracer.start_as_current_span(
                "receipt.attempt",
                attributes={
                    "receipt.job_id": job.job_id,
                    "receipt.attempt": attempt.attempt,
                    "receipt.worker_id": worker_id,
                },
            ),
        ):
            # This start leased the job (not a takeover): it wrote job.leased, or a retry of its
            # ambiguous commit found the lease and its first heartbeat of one instant.
            leased = any(r.type == "job.leased" for r in out.receipts) or (
                out.already
                and job.lease is not None
                and job.last_heartbeat_at == job.lease.leased_at
            )
            return await self._started(attempt, settle, job, leased, delivered)

    async def _started(
        self, attempt: AttemptInput, settle: Settlement, job: Job, leased: bool, delivered: float
    ) -> AttemptResult:
        fence = settle.fence
        worker_id = fence.worker_id
        # Temporal stopped hearing from an earlier delivery (its worker died or froze) and
        # handed the attempt to this one, which took the lease over (start-fence).
        redelivered = (delivery_ids.delivery_number(worker_id) or 1) > 1
        # Or an earlier delivery gave the job back at its worker's shutdown (a rollout: the
        # attempt refunded, its error kept until the job settles) and this one leased it again:
        # no worker lost, and not the job's first start.
        again = leased and job.error == SHUTDOWN_ERROR
        metric_counts.attempt_started(job, redelivered, leased=leased, again=again)
        _log(logging.DEBUG, "attempt started", "attempt.started", fence)  # settled: INFO
        if redelivered and not again:
            _log(
                logging.WARNING,
                "attempt redelivered; lease taken over",
                "attempt.redelivered",
                fence,
            )
        if job.abort_requested:
            return await settle.cancel(job.abort_reason)
        if redelivered and not leased:
            # The lease was another delivery's: one still running (Temporal had not heard from
            # it, its worker cut off) hears of the takeover at once (its watcher, on the
            # start-fence heartbeat's notice) and stops its handler; give it that long, so two
            # handlers of the job do not run at once.
            await asyncio.sleep(TAKEOVER_GRACE_S)
        return await self._run(attempt, settle, job, delivered)

    async def _run(
        self, attempt: AttemptInput, settle: Settlement, job: Job, delivered: float
    ) -> AttemptResult:
        fence = settle.fence
        handler = self.handlers.get(job.agent_id)
        if handler is None:
            return await settle.failure(
                no_handler_message(job.agent_id), retryable=False, status="failed", result=None
            )
        ctx = HandlerContext(
            job=job,
            attempt=attempt.attempt,
            worker_id=fence.worker_id,
            receipts=FencedReceipts(fence, job.session_key, job.organization_id),
            settings=self.settings,
            deadline=asyncio.get_running_loop().time() + attempt.execution_timeout_ms / 1000,
            gateway=self.gateway,
        )
        started = time.monotonic()
        exits = Exits(job.job_id, job.agent_id)  # its tasks' SystemExit: activities/handler_exits
        with handler_scope(exits):
            handler_task = asyncio.create_task(handler(ctx), name=f"handler:{fence.worker_id}")
        beat_task = asyncio.create_task(
            self._heartbeats(attempt, fence, ctx.commands_arrived), name="heartbeats"
        )
        reach_task = self._watch_reach(fence, delivered)
        try:
            watched = {handler_task, beat_task, exits.ended, *([reach_task] if reach_task else [])}
            done = await _wait_out(watched, ctx.deadline)
            if handler_task in done:
                return await settle.handler_done(handler_task, time.monotonic() - started)
            if exits.ended in done:  # a task the handler started exited: the handler's failure
                await _stop_handler(handler_task, job, fence)
                error = str(exits.ended.result())
                return await settle.failure(error, retryable=True, status="failed", result=None)
            if beat_task in done:
                if (failed := beat_task.exception()) is not None:
                    # A heartbeat that could not be written (the database away past its
                    # retries): the attempt raises and Temporal delivers it again, so the
                    # handler must not run on beside that next delivery.
                    await _stop_handler(handler_task, job, fence)
                    raise failed
                reason, detail = beat_task.result()
                if reason == "aborted":
                    ctx.aborted.set()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait({handler_task}, timeout=ABORT_GRACE_S)
                    await _stop_handler(handler_task, job, fence)
                    return await settle.cancel(detail)
                await _stop_handler(handler_task, job, fence)
                _log(
                    logging.WARNING,
                    "attempt lost its lease; handler stopped",
                    "attempt.lease_lost",
                    fence,
                    status=reason,
                )
                return AttemptResult(reason, worker_id=fence.worker_id, error=detail)
            if reach_task in done:
                # Temporal may have delivered the attempt again (module attempt_reach).
                await _stop_handler(handler_task, job, fence)
                outcome, detail = reach_task.result()
                cut_off(fence, outcome, detail, job.agent_id)
                if outcome == "unreadable":
                    raise CutOff(detail)  # Temporal delivers it again unless it already did
                return AttemptResult(
                    AttemptStatus.LEASE_LOST, worker_id=fence.worker_id, error=detail
                )
            await _stop_handler(handler_task, job, fence)
            return await settle.failure(
                execution_timeout_message(attempt.execution_timeout_ms),
                retryable=True,
                status=AttemptStatus.EXECUTION_TIMEOUT,
                result=None,
            )
        except asyncio.CancelledError:
            await _stop_handler(handler_task, job, fence)
            if activity.is_worker_shutdown():
                await settle.release()
            raise
        finally:
            # The attempt is over (settled, released, or no longer this delivery's): a handler
            # left running (it swallowed its cancellation) starts no command and its running
            # command is killed, as at an abort.
            ctx.aborted.set()
            await _cancel(beat_task)
            if reach_task is not None:
                await _cancel(reach_task)
            log.debug(  # its duration is `receipt_handler_duration_seconds`; the settle is INFO
                "handler finished",
                extra={
                    "event": "attempt.handler_done",
                    "jobId": fence.job_id,
                    "attempt": attempt.attempt,
                    "durationS": time.monotonic() - started,
                },
            )

    async def _heartbeats(
        self, attempt: AttemptInput, fence: AttemptFence, arrived: asyncio.Event
    ) -> tuple[str, str | None]:
        """Append `job.heartbeat` at the lease's cadence until the fence is lost or an abort
        arrives (Temporal hears from the attempt more often: `temporal_heartbeats`).

        Returns `(reason, detail)`: `("aborted", reason)` or a rejection status. An abort is
        noticed at the next heartbeat, or at once when this process's listener sees a command
        appended to the job's stream (which also sets `arrived`, the handler's hint to read its
        commands).
        """
        interval = attempt.heartbeat_ms / 1000
        wake = asyncio.Event()
        async with contextlib.AsyncExitStack() as stack:
            if self.listener is not None:
                # This job's notices only: the process's other appends wake no watcher.
                stream = job_stream(attempt.job_id)
                queue = await stack.enter_async_context(
                    self.listener.subscribe(stream, channel=COMMANDS)
                )
                watcher = asyncio.create_task(watch_commands(queue, attempt.job_id, wake, arrived))
                stack.callback(watcher.cancel)
            next_beat = time.monotonic() + interval
            while True:
                with contextlib.suppress(TimeoutError):
                    await within(wake.wait(), max(0.0, next_beat - time.monotonic()))
                if wake.is_set():
                    wake.clear()
                    job = await fence.read()
                    if job is not None and job.abort_requested:
                        return "aborted", job.abort_reason
                    if taken_over(job, fence):
                        # Taken over (Temporal delivered the attempt again: it had not heard
                        # from this one for its heartbeat timeout): stop now, not at the next
                        # heartbeat, a lease cadence away, beside the new delivery's handler.
                        return AttemptStatus.LEASE_LOST, "taken over by a later delivery"
                    continue
                metrics.HEARTBEAT_LAG.observe(max(0.0, time.monotonic() - next_beat))
                out = await fence.heartbeat(attempt.lease_ms)
                if not out.ok:
                    return REJECTED_STATUS.get(
                        out.status, AttemptStatus.LEASE_LOST
                    ), f"heartbeat {out.status}"
                if out.job is not None and out.job.abort_requested:
                    return "aborted", out.job.abort_reason
                next_beat = time.monotonic() + interval


async def _wait_out(
    tasks: set[asyncio.Future[Any]], deadline: float | None
) -> set[asyncio.Future[Any]]:
    """Wait for the first of `tasks` (the handler, the heartbeats, an exit of the handler's
    tasks, the reach watch) to end, at most until the execution `deadline` (event-loop time);
    what ended."""
    left = None if deadline is None else max(0.0, deadline - asyncio.get_running_loop().time())
    done, _ = await asyncio.wait(tasks, timeout=left, return_when=asyncio.FIRST_COMPLETED)
    return done


def _log(level: int, message: str, event: str, fence: AttemptFence, **extra: Any) -> None:
    """Log an attempt's `event`, naming its job, attempt and delivery."""
    named = {"jobId": fence.job_id, "attempt": fence.attempt, "workerId": fence.worker_id}
    log.log(level, message, extra={"event": event, **named, **extra})


async def _cancel(task: asyncio.Task[Any], seconds: float | None = None) -> bool:
    """Cancel `task` and wait until it ends, at most `seconds` (None: however long it
    takes); whether it ended. What it raised is retrieved: the caller has settled on its own."""
    if not task.done():
        task.cancel()
        ended, _ = await asyncio.wait({task}, timeout=seconds)
        if not ended:
            return False
    if not task.cancelled():
        task.exception()
    return True


async def _stop_handler(task: asyncio.Task[Any], job: Job, fence: AttemptFence) -> None:
    """Cancel the handler; one still running `HANDLER_CANCEL_S` later is left to end on its own
    (logged `attempt.handler_abandoned`, counted): the attempt goes on without it."""
    if await _cancel(task, HANDLER_CANCEL_S):
        return
    _abandoned.add(task)
    task.add_done_callback(_forget_abandoned)
    metrics.HANDLERS_ABANDONED.labels(metrics.agent_label(job.agent_id)).inc()
    _log(
        logging.ERROR,
        f"the handler did not end within {HANDLER_CANCEL_S:g} s of its cancellation; the "
        "attempt goes on without it (it swallows CancelledError?)",
        "attempt.handler_abandoned",
        fence,
        agentId=job.agent_id,
    )


def _forget_abandoned(task: asyncio.Task[Any]) -> None:
    """An abandoned handler ended: drop it, and say what it raised (nobody else will)."""
    _abandoned.discard(task)
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning(
            "an abandoned handler ended with an error",
            extra={"event": "attempt.abandoned_handler_error", "error": repr(exc)},
        )
