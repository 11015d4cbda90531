# Over 400 lines: one attempt is one activity by design (fewer Temporal hops, docs/design.md §6).
"""The attempt activity: lease (or start-fence), run the handler under heartbeats, settle fenced."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from opentelemetry import trace
from temporalio import activity

from activities.handlers import (
    Handler,
    HandlerContext,
    HandlerError,
    no_handler_message,
)
from activities.retry import with_storage_retry
from receipts import deliveries
from receipts import operations as ops
from receipts.jobs import Job, job_stream, settle_rejection
from receipts.listen import RECONNECTED, Listener
from receipts.messages import COMPLETED, AttemptInput, AttemptResult
from receipts.store import Store
from workflows.names import EXECUTE_ATTEMPT

log = logging.getLogger("activities.attempt")
_tracer = trace.get_tracer("receipt.attempt")

ABORT_GRACE_S = 5.0
SHUTDOWN_ERROR = "worker shutdown"
# Temporal heartbeats: a quarter of the heartbeat timeout, at most this often and at least
# this rarely (the SDK throttles what it sends to 0.8 × the timeout).
TEMPORAL_BEATS_PER_TIMEOUT = 4
TEMPORAL_BEAT_MIN_S, TEMPORAL_BEAT_MAX_S = 0.2, 5.0

# The outcome of a rejected fenced write, as the attempt's result status.
_REJECTED = {
    ops.STALE_ATTEMPT: "stale_attempt",
    ops.LEASE_LOST: "lease_lost",
    ops.TERMINAL_STATE: "terminal_state",
    ops.SETTLEMENT_CONFLICT: "settlement_conflict",
    ops.NOT_QUEUED: "stale_attempt",
    ops.NOT_AVAILABLE: "stale_attempt",
    ops.NOT_FOUND: "stale_attempt",
}


def execution_timeout_message(timeout_ms: int) -> str:
    """The error of a handler that ran past its execution timeout."""
    return f"execution timed out after {timeout_ms} ms"


@dataclass
class AttemptHooks:
    """Observation points for metrics (set by the role); each is optional."""

    on_started: Callable[[Job], None] | None = None
    on_settled: Callable[[str, Job | None, float | None], None] | None = None
    on_heartbeat_lag: Callable[[float], None] | None = None
    on_redelivered: Callable[[Job], None] | None = None


def process_identity(role: str) -> dict[str, Any]:
    """The process identity recorded beside a lease: host, pid, role."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "role": role}


class AttemptActivities:
    """Holds what the attempt activity needs: the store, the handler registry, the listener."""

    def __init__(
        self,
        store: Store,
        handlers: Mapping[str, Handler],
        *,
        role: str = "worker",
        listener: Listener | None = None,
        hooks: AttemptHooks | None = None,
    ) -> None:
        self.store = store
        self.handlers = handlers
        self.role = role
        self.listener = listener
        self.hooks = hooks or AttemptHooks()

    @activity.defn(name=EXECUTE_ATTEMPT)
    async def execute_attempt(self, attempt: AttemptInput) -> AttemptResult:
        """Lease or start-fence, check abort, run the handler racing heartbeats and the
        execution timeout, then settle under the fence. Returns the attempt's result status."""
        info = activity.info()
        worker_id = f"{attempt.job_id}:attempt:{attempt.attempt}/{info.attempt}"
        ledger = functools.partial(
            deliveries.ledger_activity,
            self.store,
            workflow_id=info.workflow_id or "",
            activity_id=info.activity_id,
            attempt=info.attempt,
            job_id=attempt.job_id,
            activity=EXECUTE_ATTEMPT,
            worker_id=worker_id,
        )
        alive = asyncio.create_task(
            _temporal_heartbeats(info.heartbeat_timeout, self._beat_details(worker_id)),
            name=f"temporal-heartbeats:{worker_id}",
        )
        try:
            async with deliveries.written_beside(ledger(status="started")):
                result = await self._execute(attempt, worker_id)
        finally:
            await _cancel(alive)
        await ledger(
            status=result.status, detail={"jobStatus": result.job_status, "error": result.error}
        )
        return result

    def _beat_details(self, worker_id: str) -> dict[str, Any]:
        """What the Temporal UI shows as the attempt's last heartbeat: which delivery, where."""
        return {"workerId": worker_id, **process_identity(self.role)}

    async def _execute(self, attempt: AttemptInput, worker_id: str) -> AttemptResult:
        job_id = attempt.job_id
        # One transaction: lease a queued job with its first heartbeat (→ running), or take a
        # redelivered attempt's lease over with a start-fence heartbeat.
        out = await with_storage_retry(
            lambda: ops.start_attempt(
                self.store,
                job_id,
                attempt=attempt.attempt,
                worker_id=worker_id,
                lease_ms=attempt.lease_ms,
                process=process_identity(self.role),
            ),
            what="start attempt",
        )
        if not out.ok or out.job is None:
            if out.status == ops.NOT_FOUND:
                return AttemptResult("stale_attempt", error="job not found", worker_id=worker_id)
            return _rejected(out.status, out.job, worker_id)
        job = out.job
        if self.hooks.on_started:
            self.hooks.on_started(job)
        log.info(
            "attempt started",
            extra={
                "event": "attempt.started",
                "jobId": job_id,
                "attempt": attempt.attempt,
                "workerId": worker_id,
            },
        )
        if (ops.delivery_number(worker_id) or 1) > 1:
            # Temporal stopped hearing from an earlier delivery (its worker died or froze) and
            # handed the attempt to this one, which took the lease over (start-fence).
            if self.hooks.on_redelivered:
                self.hooks.on_redelivered(job)
            log.warning(
                "attempt redelivered; lease taken over",
                extra={
                    "event": "attempt.redelivered",
                    "jobId": job_id,
                    "attempt": attempt.attempt,
                    "workerId": worker_id,
                },
            )
        if job.abort_requested:
            return await self._settle_cancel(attempt, worker_id, job.abort_reason)
        return await self._run(attempt, worker_id, job)

    async def _run(self, attempt: AttemptInput, worker_id: str, job: Job) -> AttemptResult:
        job_id = attempt.job_id
        handler = self.handlers.get(job.agent_id)
        if handler is None:
            return await self._settle_failure(
                attempt,
                worker_id,
                no_handler_message(job.agent_id),
                retryable=False,
                status="failed",
                result=None,
            )
        ctx = HandlerContext(
            job=job,
            attempt=attempt.attempt,
            worker_id=worker_id,
            progress=lambda data: self._progress(attempt, worker_id, data),
            refresh=lambda: self.store.get_job(job_id),
            consume=lambda command_id: self._consume(attempt, worker_id, command_id),
            store=self.store,
        )
        started = time.monotonic()
        handler_task = asyncio.create_task(handler(ctx), name=f"handler:{worker_id}")
        beat_task = asyncio.create_task(self._heartbeats(attempt, worker_id), name="heartbeats")
        try:
            done, _ = await asyncio.wait(
                {handler_task, beat_task},
                timeout=attempt.execution_timeout_ms / 1000,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if handler_task in done:
                return await self._settle_handler(
                    attempt, worker_id, handler_task, time.monotonic() - started
                )
            if beat_task in done:
                reason, detail = beat_task.result()
                if reason == "aborted":
                    ctx.aborted.set()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait({handler_task}, timeout=ABORT_GRACE_S)
                    await _cancel(handler_task)
                    return await self._settle_cancel(attempt, worker_id, detail)
                await _cancel(handler_task)
                log.warning(
                    "attempt lost its lease; handler stopped",
                    extra={
                        "event": "attempt.lease_lost",
                        "jobId": job_id,
                        "attempt": attempt.attempt,
                        "workerId": worker_id,
                        "status": reason,
                    },
                )
                return AttemptResult(reason, worker_id=worker_id, error=detail)
            await _cancel(handler_task)
            return await self._settle_failure(
                attempt,
                worker_id,
                execution_timeout_message(attempt.execution_timeout_ms),
                retryable=True,
                status="execution_timeout",
                result=None,
            )
        except asyncio.CancelledError:
            await _cancel(handler_task)
            if activity.is_worker_shutdown():
                await self._release(attempt, worker_id)
            raise
        finally:
            await _cancel(beat_task)
            log.info(
                "handler finished",
                extra={
                    "event": "attempt.handler_done",
                    "jobId": job_id,
                    "attempt": attempt.attempt,
                    "durationS": time.monotonic() - started,
                },
            )

    async def _heartbeats(self, attempt: AttemptInput, worker_id: str) -> tuple[str, str | None]:
        """Append `job.heartbeat` at the lease's cadence until the fence is lost or an abort
        arrives (Temporal hears from the attempt more often: `_temporal_heartbeats`).

        Returns `(reason, detail)`: `("aborted", reason)` or a rejection status. An abort is
        noticed at the next heartbeat, or at once when this process's listener sees a command
        appended to the job's stream.
        """
        interval = attempt.heartbeat_ms / 1000
        wake = asyncio.Event()
        async with contextlib.AsyncExitStack() as stack:
            if self.listener is not None:
                # This job's notices only: the process's other appends wake no watcher.
                stream = job_stream(attempt.job_id)
                queue = await stack.enter_async_context(self.listener.subscribe(stream))
                watcher = asyncio.create_task(_watch_commands(queue, attempt.job_id, wake))
                stack.callback(watcher.cancel)
            next_beat = time.monotonic() + interval
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), max(0.0, next_beat - time.monotonic()))
                if wake.is_set():
                    wake.clear()
                    job = await with_storage_retry(
                        lambda: self.store.get_job(attempt.job_id), what="read job"
                    )
                    if job is not None and job.abort_requested:
                        return "aborted", job.abort_reason
                    continue
                lag = time.monotonic() - next_beat
                if self.hooks.on_heartbeat_lag:
                    self.hooks.on_heartbeat_lag(lag)
                out = await with_storage_retry(
                    lambda: ops.heartbeat(
                        self.store,
                        attempt.job_id,
                        worker_id=worker_id,
                        attempt=attempt.attempt,
                        lease_ms=attempt.lease_ms,
                    ),
                    what="heartbeat",
                )
                if not out.ok:
                    return _REJECTED.get(out.status, "lease_lost"), f"heartbeat {out.status}"
                if out.job is not None and out.job.abort_requested:
                    return "aborted", out.job.abort_reason
                next_beat = time.monotonic() + interval

    async def _progress(self, attempt: AttemptInput, worker_id: str, data: Any) -> bool:
        out = await with_storage_retry(
            lambda: ops.progress(
                self.store,
                attempt.job_id,
                worker_id=worker_id,
                attempt=attempt.attempt,
                data=data,
            ),
            what="progress",
        )
        return out.ok

    async def _consume(self, attempt: AttemptInput, worker_id: str, command_id: str) -> bool:
        out = await with_storage_retry(
            lambda: ops.consume_command(
                self.store,
                attempt.job_id,
                worker_id=worker_id,
                attempt=attempt.attempt,
                command_id=command_id,
            ),
            what="consume command",
        )
        return out.ok

    async def _settle_handler(
        self, attempt: AttemptInput, worker_id: str, task: asyncio.Task[Any], handler_s: float
    ) -> AttemptResult:
        try:
            value = task.result()
        except HandlerError as exc:
            return await self._settle_failure(
                attempt,
                worker_id,
                str(exc),
                retryable=exc.retryable,
                status="failed",
                result=exc.result,
                handler_s=handler_s,
                retry_delay_ms=exc.retry_delay_ms,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a handler bug: retry it while attempts remain
            log.exception(
                "handler raised", extra={"event": "attempt.handler_error", "jobId": attempt.job_id}
            )
            return await self._settle_failure(
                attempt,
                worker_id,
                f"{type(exc).__name__}: {exc}",
                retryable=True,
                status="failed",
                result=None,
                handler_s=handler_s,
            )
        reread = await with_storage_retry(
            lambda: self.store.get_job_with_now(attempt.job_id), what="re-read"
        )
        latest = reread[0]
        if latest is not None and latest.abort_requested and not latest.terminal:
            return await self._settle_cancel(attempt, worker_id, latest.abort_reason, reread)
        return await self._settle(
            attempt,
            worker_id,
            COMPLETED,
            lambda: ops.complete(
                self.store,
                attempt.job_id,
                worker_id=worker_id,
                attempt=attempt.attempt,
                result=value,
            ),
            handler_s,
            reread,
        )

    async def _settle_failure(
        self,
        attempt: AttemptInput,
        worker_id: str,
        error: str,
        *,
        retryable: bool,
        status: str,
        result: Any,
        handler_s: float | None = None,
        retry_delay_ms: int | None = None,
    ) -> AttemptResult:
        outcome = await self._settle(
            attempt,
            worker_id,
            status,
            lambda: ops.fail(
                self.store,
                attempt.job_id,
                worker_id=worker_id,
                attempt=attempt.attempt,
                error=error,
                retryable=retryable,
                status=None if retryable else status,
                result=result,
                retry_delay_ms=retry_delay_ms,
            ),
            handler_s,
        )
        outcome.error = error
        outcome.retryable = retryable
        return outcome

    async def _settle_cancel(
        self,
        attempt: AttemptInput,
        worker_id: str,
        reason: str | None,
        reread: tuple[Job | None, datetime] | None = None,
    ) -> AttemptResult:
        return await self._settle(
            attempt,
            worker_id,
            "canceled",
            lambda: ops.cancel(
                self.store,
                attempt.job_id,
                worker_id=worker_id,
                attempt=attempt.attempt,
                reason=reason,
            ),
            reread=reread,
        )

    async def _settle(
        self,
        attempt: AttemptInput,
        worker_id: str,
        status: str,
        write: Callable[[], Awaitable[ops.Outcome]],
        handler_s: float | None = None,
        reread: tuple[Job | None, datetime] | None = None,
    ) -> AttemptResult:
        with _tracer.start_as_current_span(
            "receipt.settle",
            attributes={"receipt.job_id": attempt.job_id, "receipt.status": status},
        ):
            # Re-read first: a fence already lost (or a job already settled by someone else)
            # ends the attempt without a write; a write refused after a clean re-read means a
            # concurrent append won in between — a settlement conflict. The re-read applies
            # the settle's own rule at the database clock, expiry included.
            if reread is None:
                reread = await with_storage_retry(
                    lambda: self.store.get_job_with_now(attempt.job_id), what="re-read"
                )
            current, now = reread
            before = settle_rejection(current, worker_id, attempt.attempt, now, worker_id)
            out = (
                ops.Outcome(before, current)
                if before
                else await with_storage_retry(write, what="settle")
            )
        job_status = out.job.status if out.job else ""
        if out.ok:
            result = AttemptResult(status, job_status=job_status, worker_id=worker_id)
        elif before:
            result = _rejected(out.status, out.job, worker_id)
        else:
            result = _rejected(ops.SETTLEMENT_CONFLICT, out.job, worker_id)
            result.detail = {"refusedAs": out.status}
        if self.hooks.on_settled:
            self.hooks.on_settled(result.status, out.job, handler_s)
        log.info(
            "attempt settled",
            extra={
                "event": "attempt.settled",
                "jobId": attempt.job_id,
                "attempt": attempt.attempt,
                "workerId": worker_id,
                "status": result.status,
                "jobStatus": job_status,
            },
        )
        return result

    async def _release(self, attempt: AttemptInput, worker_id: str) -> None:
        """Graceful shutdown: give the job back without costing an attempt."""
        out = await with_storage_retry(
            lambda: ops.fail(
                self.store,
                attempt.job_id,
                worker_id=worker_id,
                attempt=attempt.attempt,
                error=SHUTDOWN_ERROR,
                retryable=True,
                refund_attempt=True,
            ),
            what="release",
        )
        log.warning(
            "job released at shutdown",
            extra={
                "event": "attempt.released",
                "jobId": attempt.job_id,
                "attempt": attempt.attempt,
                "status": out.status,
            },
        )


def _rejected(status: str, job: Job | None, worker_id: str) -> AttemptResult:
    return AttemptResult(
        _REJECTED.get(status, status),
        job_status=job.status if job else "",
        worker_id=worker_id,
        error=f"rejected: {status}",
    )


async def _cancel(task: asyncio.Task[Any]) -> None:
    if task.done():
        if not task.cancelled():
            task.exception()  # retrieved: the caller has already settled on its outcome
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


async def _temporal_heartbeats(timeout: timedelta | None, details: Any) -> None:
    """Tell Temporal the attempt's worker is alive, every few seconds, until cancelled.

    Decoupled from the `job.heartbeat` receipts (which keep the lease's cadence): Temporal
    redelivers the attempt once it hears nothing for the heartbeat timeout
    (`RECEIPT_WORKER_LOST_TIMEOUT_MS`), so a dead worker is found in seconds, not in two
    receipt cadences (minutes at the spec's leases).
    """
    if timeout is None:
        return
    interval = min(
        TEMPORAL_BEAT_MAX_S,
        max(TEMPORAL_BEAT_MIN_S, timeout.total_seconds() / TEMPORAL_BEATS_PER_TIMEOUT),
    )
    while True:
        activity.heartbeat(details)
        await asyncio.sleep(interval)


async def _watch_commands(queue: asyncio.Queue[Any], job_id: str, wake: asyncio.Event) -> None:
    stream = job_stream(job_id)
    while True:
        notice = await queue.get()
        if notice is RECONNECTED or (notice.stream == stream and "queue.command" in notice.types):
            wake.set()
