"""Server-sent events: a job's receipts, live until it is terminal, and the caps on open streams.

Each stream subscribes to its own job stream's notices only (the listener routes them), counts
against a per-token and an overall cap (429 beyond), and ends after a maximum lifetime; an
EventSource then reconnects with `Last-Event-ID` and resumes where it left off.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from receipts import jobs as jobmodel
from receipts.errors import TransientStorageError
from receipts.jobs import Job, Receipt
from receipts.listen import RECONNECTED, Listener, Notice
from receipts.store import Store
from roles.api.errors import ApiError, too_many
from roles.api.limits import EVENT_STREAMS, LIMITED

log = logging.getLogger("roles.api.app")

SSE_KEEPALIVE_S = 15.0
SSE_RETRY_MS = 1000
SSE_PAGE = 1000
MAX_EVENT_ID_DIGITS = 18
"""A receipt seq fits a PostgreSQL bigint; longer `Last-Event-ID` values are refused (not parsed)."""


def sse_receipt(receipt: Receipt, data: dict[str, Any] | None = None) -> str:
    """Return one receipt as an SSE event; its `id` is the receipt's seq."""
    body = data if data is not None else receipt.to_json()
    return f"id: {receipt.seq}\ndata: {json.dumps(body, separators=(',', ':'))}\n\n"


def sse_end(job: Job, job_id: str | None = None) -> str:
    """Return the closing event, sent after the receipt that made the job terminal."""
    data = json.dumps({"jobId": job_id or job.job_id, "status": job.status}, separators=(",", ":"))
    return f"event: end\ndata: {data}\n\n"


class StreamGate:
    """Counts open event streams, overall and per token; refuses one more with 429."""

    def __init__(self, overall: int, per_token: int) -> None:
        self.overall = overall
        self.per_token = per_token
        self.open: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self.open.values())

    def acquire(self, token_id: str) -> StreamSlot:
        """Take one slot for `token_id`, or raise 429; the slot is given back by `release`."""
        if self.open[token_id] >= self.per_token:
            LIMITED.labels("streams_token").inc()
            log.warning(
                "event stream refused: the token's cap",
                extra={"event": "api.sse_refused", "cap": "token", "tokenId": token_id},
            )
            raise too_many(
                f"this token already has {self.per_token} open event streams "
                "(RECEIPT_SSE_MAX_STREAMS_PER_CALLER)",
                SSE_RETRY_MS / 1000,
            )
        if self.total >= self.overall:
            LIMITED.labels("streams_total").inc()
            log.warning(
                "event stream refused: the api's cap",
                extra={"event": "api.sse_refused", "cap": "total", "tokenId": token_id},
            )
            raise too_many(
                f"the API already serves {self.overall} event streams (RECEIPT_SSE_MAX_STREAMS)",
                SSE_RETRY_MS / 1000,
            )
        self.open[token_id] += 1
        EVENT_STREAMS.inc()
        return StreamSlot(self, token_id)

    def _release(self, token_id: str) -> None:
        EVENT_STREAMS.dec()
        self.open[token_id] -= 1
        if self.open[token_id] <= 0:
            del self.open[token_id]


class StreamSlot:
    """One open stream's place in the gate; `release` is idempotent."""

    def __init__(self, gate: StreamGate, token_id: str) -> None:
        self._gate: StreamGate | None = gate
        self.token_id = token_id

    def release(self) -> None:
        if self._gate is not None:
            gate, self._gate = self._gate, None
            gate._release(self.token_id)

    def held_by(self, stream: AsyncIterator[str]) -> AsyncIterator[str]:
        """`stream`, giving the slot back when it ends or is closed, and also when it is
        dropped without ever being started (a client gone before the response began)."""

        async def gated() -> AsyncIterator[str]:
            try:
                async for event in stream:
                    yield event
            finally:
                self.release()

        iterator = gated()
        weakref.finalize(iterator, self.release)
        return iterator


def parse_last_event_id(value: str | None, default: int) -> int:
    """The seq to resume after: `Last-Event-ID` when given (a receipt seq), else `default`."""
    if value is None:
        return default
    text = value.strip()
    if not text.isascii() or not text.isdigit() or len(text) > MAX_EVENT_ID_DIGITS:
        raise ApiError(
            422,
            "invalid_input",
            f"Last-Event-ID must be a receipt seq (0 to {MAX_EVENT_ID_DIGITS} digits)",
            field="Last-Event-ID",
        )
    return int(text)


async def receipt_events(
    store: Store,
    listener: Listener,
    stopping: asyncio.Event,
    job_id: str,
    after: int,
    keepalive_s: float = SSE_KEEPALIVE_S,
    *,
    max_lifetime_s: float | None = None,
    shown_id: str | None = None,
    redact: Any = None,
) -> AsyncIterator[str]:
    """Yield a job's receipts with `seq > after` as SSE events, live, until it is terminal.

    The subscription opens before the backlog is read, so no append falls between the two;
    the state is folded from seq 1 (to know when the job turns terminal) and only receipts past
    `after` are sent, each once, in order. A notice for the stream or a `RECONNECTED` marker
    triggers a re-read from the last seq seen; the database is never polled. The stream ends
    after the terminal receipt, when the server stops, after `max_lifetime_s`, or when the
    database is lost (a client then reconnects with `Last-Event-ID`). `redact` maps a
    receipt's JSON to what the caller may see; `shown_id` is the job id the caller knows.
    """
    stream = jobmodel.job_stream(job_id)
    state: Job | None = None
    folded = 0
    ends_at = time.monotonic() + max_lifetime_s if max_lifetime_s else None
    async with listener.subscribe(stream) as notices:
        yield f"retry: {SSE_RETRY_MS}\n\n"
        stop = asyncio.ensure_future(stopping.wait())
        try:
            while True:
                try:
                    batch = await store.read_stream(stream, folded, SSE_PAGE)
                except TransientStorageError as exc:
                    log.warning(
                        "event stream lost the database",
                        extra={"event": "api.sse_storage_lost", "jobId": job_id, "error": str(exc)},
                    )
                    return
                for receipt in batch:
                    state = jobmodel.apply(state, receipt)
                    folded = receipt.seq
                    if receipt.seq > after:
                        data = redact(receipt.to_json()) if redact else None
                        yield sse_receipt(receipt, data)
                        if state is not None and state.terminal:
                            yield sse_end(state, shown_id)
                            return
                if len(batch) == SSE_PAGE:
                    continue
                if state is not None and state.terminal:
                    yield sse_end(state, shown_id)
                    return
                while True:
                    wait_s = keepalive_s
                    if ends_at is not None:
                        left = ends_at - time.monotonic()
                        if left <= 0:
                            log.info(
                                "event stream reached its maximum lifetime",
                                extra={"event": "api.sse_lifetime", "jobId": job_id},
                            )
                            return
                        wait_s = min(wait_s, left)
                    notice = await _next_notice(notices, stop, wait_s)
                    if notice is None:
                        yield ": keepalive\n\n"
                    elif notice is _STOP:
                        return
                    elif notice is RECONNECTED or (notice.stream == stream and notice.seq > folded):
                        break
        finally:
            stop.cancel()


_STOP = Notice("", -1, ())


async def _next_notice(
    notices: asyncio.Queue[Notice], stop: asyncio.Future[Any], keepalive_s: float
) -> Notice | None:
    """Return the next notice, `_STOP` once the server stops, or None after the keepalive period."""
    get = asyncio.ensure_future(notices.get())
    try:
        done, _ = await asyncio.wait(
            {get, stop}, timeout=keepalive_s, return_when="FIRST_COMPLETED"
        )
    finally:
        if not get.done():
            get.cancel()
    if get in done:
        return get.result()
    if stop in done:
        return _STOP
    return None
