"""Settling an attempt: the handler's outcome (or an abort, a timeout, a shutdown) becomes one
terminal or requeueing receipt, written under the attempt's fence after a re-read."""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from opentelemetry import trace

from activities.fence import AttemptFence
from activities.handlers.context import HandlerError
from activities.handlers.fenced import FenceLost
from receipts import metric_counts
from receipts import operations as ops
from receipts.jobs import Job, settle_rejection
from receipts.messages import COMPLETED, AttemptResult, AttemptStatus

log = logging.getLogger("activities.settle")
_tracer = trace.get_tracer("receipt.attempt")

SHUTDOWN_ERROR = "worker shutdown"

# The outcome of a rejected fenced write, as the attempt's result status.
REJECTED_STATUS = {
    ops.STALE_ATTEMPT: AttemptStatus.STALE_ATTEMPT,
    ops.LEASE_LOST: AttemptStatus.LEASE_LOST,
    ops.TERMINAL_STATE: AttemptStatus.TERMINAL_STATE,
    ops.SETTLEMENT_CONFLICT: AttemptStatus.SETTLEMENT_CONFLICT,
    ops.NOT_QUEUED: AttemptStatus.STALE_ATTEMPT,
    ops.NOT_AVAILABLE: AttemptStatus.STALE_ATTEMPT,
    ops.NOT_FOUND: AttemptStatus.STALE_ATTEMPT,
}

Reread = tuple[Job | None, datetime]


def rejected(status: str, job: Job | None, worker_id: str) -> AttemptResult:
    """The attempt's result when a fenced write was refused with `status`."""
    return AttemptResult(
        REJECTED_STATUS.get(status, status),
        job_status=job.status if job else "",
        worker_id=worker_id,
        error=f"rejected: {status}",
    )


def _described(exc: BaseException) -> str:
    """`str(exc)`, or what stands for it when the exception cannot say (its `__str__` raised)."""
    try:
        return str(exc)
    except Exception as broken:
        return f"<str() of the exception raised {type(broken).__name__}>"


def _record_exception(exc: BaseException) -> None:
    """What the handler raised, on the attempt's span (its `exception` event), bounded: the
    SDK's `record_exception` calls `str(exc)`, which may raise (`_described`)."""
    stack = "".join(traceback.format_exception(exc))  # a `__str__` that raises is named so
    trace.get_current_span().add_event(
        "exception",
        {
            "exception.type": type(exc).__qualname__,
            "exception.message": ops.bounded_error(_described(exc)),
            "exception.stacktrace": stack[-ops.MAX_ERROR_CHARS :],
        },
    )


class Settlement:
    """The ways one delivery of an attempt ends, each a fenced write through `fence`."""

    def __init__(self, fence: AttemptFence) -> None:
        self.fence = fence

    async def handler_done(self, task: asyncio.Task[Any], handler_s: float) -> AttemptResult:
        """Settle what the finished handler `task` returned or raised. An abort that arrived
        while it ran wins over its result."""
        try:
            value = task.result()
        except HandlerError as exc:
            return await self.failure(
                str(exc),
                retryable=exc.retryable,
                status="failed",
                result=exc.result,
                handler_s=handler_s,
                retry_delay_ms=exc.retry_delay_ms,
            )
        except asyncio.CancelledError:
            # Nobody cancelled the handler: the attempt stops waiting for it before it cancels
            # it. Its own code raised CancelledError (it awaited a task or future something
            # else cancelled): a handler failure, retried as an exception is.
            log.warning(
                "handler raised CancelledError without being cancelled",
                extra={"event": "attempt.handler_error", "jobId": self.fence.job_id},
            )
            return await self.failure(
                "CancelledError: the handler ended cancelled without being cancelled (it "
                "awaited something that was cancelled)",
                retryable=True,
                status="failed",
                result=None,
                handler_s=handler_s,
            )
        except FenceLost as exc:
            # An objective write was refused (logged there): the settle is refused the same way
            # and the result says why; no handler bug to report.
            return await self.failure(
                str(exc), retryable=True, status="failed", result=None, handler_s=handler_s
            )
        except BaseException as exc:  # a handler bug: retry it while attempts remain
            _record_exception(exc)
            log.exception(
                "handler raised",
                extra={"event": "attempt.handler_error", "jobId": self.fence.job_id},
            )
            return await self.failure(
                f"{type(exc).__name__}: {_described(exc)}",
                retryable=True,
                status="failed",
                result=None,
                handler_s=handler_s,
            )
        reread = await self.fence.reread()
        latest = reread[0]
        if latest is not None and latest.abort_requested and not latest.terminal:
            return await self.cancel(latest.abort_reason, reread)
        return await self._settle(
            COMPLETED, lambda known: self.fence.complete(value, known), handler_s, reread
        )

    async def failure(
        self,
        error: str,
        *,
        retryable: bool,
        status: str,
        result: Any,
        handler_s: float | None = None,
        retry_delay_ms: int | None = None,
    ) -> AttemptResult:
        """Settle `failed`: requeued while `retryable` with attempts left, else terminal with
        `status` copied onto the job's result."""
        error = ops.bounded_error(error)
        # The attempt's span (`receipt.attempt`) is an error: a failing job shows in its trace.
        trace.get_current_span().set_status(trace.StatusCode.ERROR, error)
        outcome = await self._settle(
            status,
            lambda known: self.fence.fail(
                error,
                retryable=retryable,
                status=None if retryable else status,
                result=result,
                retry_delay_ms=retry_delay_ms,
                known=known,
            ),
            handler_s,
        )
        outcome.error = error
        outcome.retryable = retryable
        return outcome

    async def cancel(self, reason: str | None, reread: Reread | None = None) -> AttemptResult:
        """Settle `canceled`: the attempt honoured an abort."""
        return await self._settle(
            "canceled", lambda known: self.fence.cancel(reason, known), reread=reread
        )

    async def _settle(
        self,
        status: str,
        write: Callable[[Reread], Awaitable[ops.Outcome]],
        handler_s: float | None = None,
        reread: Reread | None = None,
    ) -> AttemptResult:
        fence = self.fence
        with _tracer.start_as_current_span(
            "receipt.settle",
            attributes={"receipt.job_id": fence.job_id, "receipt.status": status},
        ):
            # Re-read first: a fence already lost (or a job already settled by someone else)
            # ends the attempt without a write; a write refused after a clean re-read means a
            # concurrent append won in between — a settlement conflict. The re-read applies
            # the settle's own rule at the database clock, expiry included, and the write is
            # decided on it and guarded against it (receipts/guarded.py): one round trip.
            reread = reread if reread is not None else await fence.reread()
            current, now = reread
            before = settle_rejection(current, fence.worker_id, fence.attempt, now, fence.worker_id)
            out = ops.Outcome(before, current) if before else await write(reread)
        if out.status == ops.ABORT_REQUESTED and out.job is not None:
            # An abort committed after the re-read, before the completion's write (which it
            # refused): it wins over the result as one the re-read found does.
            log.info(
                "an abort landed as the attempt settled: it is honoured",
                extra={"event": "attempt.abort_at_settle", "jobId": fence.job_id},
            )
            return await self.cancel(out.job.abort_reason)
        job_status = out.job.status if out.job else ""
        if out.ok:
            result = AttemptResult(status, job_status=job_status, worker_id=fence.worker_id)
        elif before:
            result = rejected(out.status, out.job, fence.worker_id)
        else:
            result = rejected(ops.SETTLEMENT_CONFLICT, out.job, fence.worker_id)
            result.detail = {"refusedAs": out.status}
        metric_counts.attempt_settled(result.status, out.job, handler_s)
        log.info(
            "attempt settled",
            extra={
                "event": "attempt.settled",
                "jobId": fence.job_id,
                "attempt": fence.attempt,
                "workerId": fence.worker_id,
                "status": result.status,
                "jobStatus": job_status,
            },
        )
        return result

    async def release(self) -> None:
        """Graceful shutdown: give the job back without costing an attempt."""
        out = await self.fence.fail(
            SHUTDOWN_ERROR, retryable=True, refund_attempt=True, what="release"
        )
        log.warning(
            "job released at shutdown",
            extra={
                "event": "attempt.released",
                "jobId": self.fence.job_id,
                "attempt": self.fence.attempt,
                "status": out.status,
            },
        )
