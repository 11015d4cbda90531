"""A stream's receipts over HTTP: a JSON page, or live server-sent events behind the caps.

Every event stream the api serves (a job's, an objective's, an agent job's, an owner session's,
and the console's view of a job) is `stream_events`, opened by `events_response`: it subscribes
to its own stream's notices only (the listener routes them), counts against a per-token and an
overall cap (429 beyond), sends keepalives, ends after a maximum lifetime, and resumes after a
validated `Last-Event-ID` (an EventSource reconnects with it and misses nothing).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel

from receipts.errors import TransientStorageError
from receipts.jobs import Receipt
from receipts.listen import RECONNECTED, Listener, Notice
from receipts.store import Store
from receipts.tenancy import without_position
from roles.api.auth import Principal
from roles.api.deps import ApiState, takes_query
from roles.api.documented import sse_documented
from roles.api.errors import ApiError
from roles.api.limits import SSE_RETRY_MS
from roles.api.schema import errors_documented

log = logging.getLogger("roles.api.app")

S = TypeVar("S")
F = TypeVar("F", bound=Callable[..., Any])

SSE_KEEPALIVE_S = 15.0
SSE_PAGE = 1000
"""Receipts one read of a live stream takes at most."""
SSE_FIRST_READ = 16
SSE_READ_BYTES = 256 * 1024
"""About what one read of a live stream holds after its first (`SSE_FIRST_READ` receipts): a
stream keeps its read until the client has taken it, and one whose client stops reading keeps
it for good (50 such streams of one token each held 1 000 receipts of 8 KB: +452 MB)."""
FIRST_READ = 100
"""Receipts a JSON page reads first (`receipts_page`)."""
MAX_EVENT_ID_DIGITS = 18
"""A receipt seq fits a PostgreSQL bigint; longer `Last-Event-ID` values are refused (not parsed)."""
MAX_AFTER = 2**62
STREAM_ERRORS = (401, 403, 404, 422, 429, 503)
"""What a stream's route may answer besides 200 (a bad `Last-Event-ID` is 422, the caps 429)."""

AfterSeq = Annotated[int, Query(ge=0, le=MAX_AFTER, description="Only receipts with seq > after")]
PageLimit = Annotated[int, Query(ge=1, le=10_000, description="Receipts in one JSON page")]


def events_route(
    router: APIRouter,
    path: str,
    ending: str,
    *more_errors: int,
    end: type[BaseModel] | None = None,
    **route: Any,
) -> Callable[[F], F]:
    """Declare the GET route at `path` serving a stream's receipts: its answers (JSON, or SSE
    ending as `ending` with an `end` event of that shape; the errors of every stream and
    `more_errors`), the `Last-Event-ID` header and the `after` and `limit` queries (`Asked`)."""
    ok = {
        "description": "The receipts as JSON, or with `Accept: text/event-stream` a live "
        "stream: one event per receipt (`id` = seq, `data` = the receipt), a `: keepalive` "
        f"comment while idle. {ending}",
        "content": {"text/event-stream": sse_documented(end)},
    }
    last_event_id = {
        "name": "Last-Event-ID",
        "in": "header",
        "required": False,
        "description": "Resume after this seq (sent by EventSource on reconnect); wins over `after`",
        "schema": {"type": "string", "pattern": f"^[0-9]{{1,{MAX_EVENT_ID_DIGITS}}}$"},
    }
    declare: Callable[[F], F] = router.get(
        path,
        responses={200: ok, **errors_documented(*STREAM_ERRORS, *more_errors)},
        openapi_extra={"parameters": [last_event_id]},
        dependencies=[takes_query("after", "limit")],
        **route,
    )
    return declare


@dataclass(frozen=True, slots=True)
class ReceiptsAsked:
    """What a request for a stream's receipts asks: live SSE or a JSON page, from which seq."""

    request: Request
    after: int
    limit: int


async def _receipts_asked(
    request: Request, after: AfterSeq = 0, limit: PageLimit = 1000
) -> ReceiptsAsked:
    return ReceiptsAsked(request, after, limit)


Asked = Annotated[ReceiptsAsked, Depends(_receipts_asked)]
"""The dependency of a route serving a stream's receipts (its `after` and `limit` queries)."""


def sse_receipt(receipt: Receipt, data: dict[str, Any] | None = None) -> str:
    """Return one receipt as an SSE event; its `id` is the receipt's seq."""
    body = data if data is not None else receipt.to_json()
    return f"id: {receipt.seq}\ndata: {json.dumps(body, separators=(',', ':'))}\n\n"


def sse_end(data: dict[str, Any]) -> str:
    """Return the closing event, sent once the followed thing is finished."""
    return f"event: end\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def parse_seq(value: str, field: str) -> int:
    """A receipt seq given as text (`Last-Event-ID`, a query), or 422 naming `field`."""
    text = value.strip()
    if not text.isascii() or not text.isdigit() or len(text) > MAX_EVENT_ID_DIGITS:
        raise ApiError(
            422,
            "invalid_input",
            f"{field} must be a receipt seq (1 to {MAX_EVENT_ID_DIGITS} digits)",
            field=field,
        )
    return int(text)


def parse_last_event_id(value: str | None, default: int) -> int:
    """The seq to resume after: `Last-Event-ID` when given (a receipt seq), else `default`."""
    return default if value is None else parse_seq(value, "Last-Event-ID")


@dataclass(frozen=True, slots=True)
class Followed(Generic[S]):
    """What a stream's reader needs to know of one kind of stream.

    `stream` is read and its notices wake the reader. `fold` folds its receipts from seq 1 into
    the state `end` looks at once the backlog is read: the `end` event's data when the followed
    thing is finished, else None; without `fold` the stream never ends (a session's). `start`
    is that state as it stood at seq `start_seq` (its projection's row, read by the route):
    only receipts past it are folded, so a stream resumed at the head of a long history does
    not fold all of it again. `show` maps a receipt's JSON to what the caller may see.
    """

    stream: str
    fold: Callable[[S | None, Receipt], S | None] | None = None
    end: Callable[[S], dict[str, Any] | None] | None = None
    show: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    start: S | None = None
    start_seq: int = 0

    def shown(self, receipt: Receipt) -> dict[str, Any]:
        return self.show(receipt.to_json()) if self.show else receipt.to_json()


def as_seen_by(caller: Principal, followed: Followed[S]) -> Followed[S]:
    """`followed` with its receipts as `caller` may see them: an admin sees each one's global
    `position`, an organization none (receipts/tenancy.py `without_position`)."""
    if caller.admin:
        return followed
    show = followed.show

    def hidden(receipt: dict[str, Any]) -> dict[str, Any]:
        return without_position(show(receipt) if show else receipt)

    return dataclasses.replace(followed, show=hidden)


async def stream_events(
    store: Store,
    listener: Listener,
    stopping: asyncio.Event,
    followed: Followed[S],
    after: int,
    *,
    keepalive_s: float = SSE_KEEPALIVE_S,
    max_lifetime_s: float | None = None,
    alive: Callable[[], Awaitable[bool]] | None = None,
) -> AsyncIterator[str]:
    """Yield the receipts of `followed.stream` with `seq > after` as SSE events, live.

    The subscription opens before the backlog is read, so no append falls between the two.
    A stream with a fold is read from seq 1, or from its `start` state's seq when that comes
    first (to know when it is finished: receipts past `start_seq` are folded into it), and only
    receipts past `after` are sent, each once, in order. A notice for the stream or a `RECONNECTED`
    marker triggers a re-read from the last seq seen; the database is never polled. The stream
    ends with `event: end` once everything is sent and the state is finished, or without it
    when the server stops, after `max_lifetime_s`, or when the database is lost (a client
    then reconnects with `Last-Event-ID`). `alive` (a console session's) is asked before each
    batch of receipts is sent and at each keepalive: once it says no, or cannot tell, the
    stream ends (a signed-out or expired session streams nothing more).
    """
    stream = followed.stream
    state: S | None = followed.start
    folded = followed.start_seq if followed.start is not None else 0
    read = min(after, folded) if followed.fold else after
    ends_at = time.monotonic() + max_lifetime_s if max_lifetime_s else None
    wanted = SSE_FIRST_READ
    async with listener.subscribe(stream) as notices:
        yield f"retry: {SSE_RETRY_MS}\n\n"
        stop = asyncio.ensure_future(stopping.wait())
        try:
            while True:
                asked = wanted
                try:
                    batch = await store.read_stream(stream, read, asked)
                except TransientStorageError as exc:
                    log.warning(
                        "event stream lost the database",
                        extra={
                            "event": "api.sse_storage_lost",
                            "stream": stream,
                            "error": str(exc),
                        },
                    )
                    return
                if alive is not None and batch and batch[-1].seq > after:
                    if not await _still(alive, stream):
                        return
                sent = sent_bytes = 0
                for receipt in batch:
                    if followed.fold and receipt.seq > folded:
                        state = followed.fold(state, receipt)
                    read = receipt.seq
                    if receipt.seq > after:
                        event = sse_receipt(receipt, followed.shown(receipt))
                        sent, sent_bytes = sent + 1, sent_bytes + len(event)
                        yield event
                if sent:  # the next read: about SSE_READ_BYTES at the size of these
                    wanted = max(1, min(SSE_PAGE, SSE_READ_BYTES * sent // sent_bytes))
                if len(batch) == asked:
                    continue
                end = followed.end(state) if followed.end and state is not None else None
                if end is not None:
                    yield sse_end(end)
                    return
                while True:
                    wait_s = keepalive_s
                    if ends_at is not None:
                        left = ends_at - time.monotonic()
                        if left <= 0:
                            log.info(
                                "event stream reached its maximum lifetime",
                                extra={"event": "api.sse_lifetime", "stream": stream},
                            )
                            return
                        wait_s = min(wait_s, left)
                    notice = await _next_notice(notices, stop, wait_s)
                    if notice is None:
                        if alive is not None and not await _still(alive, stream):
                            return
                        yield ": keepalive\n\n"
                    elif notice is _STOP:
                        return
                    elif notice is RECONNECTED or (notice.stream == stream and notice.seq > read):
                        break
        finally:
            stop.cancel()


_STOP = Notice("", -1, ())


async def _still(alive: Callable[[], Awaitable[bool]], stream: str) -> bool:
    """Whether the session a stream serves still stands (a database that cannot tell: no)."""
    try:
        standing = await alive()
    except TransientStorageError:
        standing = False
    if not standing:
        log.info(
            "event stream ended: its session was signed out or expired",
            extra={"event": "api.sse_session_ended", "stream": stream},
        )
    return standing


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


def wants_stream(request: Request) -> bool:
    """True when the request asks for server-sent events rather than a JSON page."""
    return "text/event-stream" in request.headers.get("accept", "")


def json_size(value: Any) -> int:
    """The length of `value` as compact JSON (what the response byte cap counts)."""
    return len(json.dumps(value, separators=(",", ":")))


def within_budget(views: Iterable[dict[str, Any]], budget: int) -> list[dict[str, Any]]:
    """The views, in order, until the next would take the page past `budget` bytes of JSON
    (`RECEIPT_MAX_RESPONSE_BYTES`); at least one. A list whose items hold large fields ends its
    page early, and its cursor continues after the last item shown."""
    kept: list[dict[str, Any]] = []
    for view in views:
        budget -= json_size(view)
        if kept and budget < 0:
            break
        kept.append(view)
    return kept


Item = TypeVar("Item")


def last_shown(items: Sequence[Item], shown: int, more: bool) -> Item | None:
    """What a page's cursor continues after: the last of the `shown` first `items` when the
    list goes on (`more`) or `within_budget` ended the page early; None at the list's end."""
    return items[shown - 1] if shown and (more or shown < len(items)) else None


def stream_response(
    state: ApiState,
    token_id: str,
    followed: Followed[S],
    after: int,
    alive: Callable[[], Awaitable[bool]] | None = None,
) -> StreamingResponse:
    """The live stream of `followed` past `after`, holding one of `token_id`'s slots (429
    when the token or the api is at its cap) for as long as it is open; while `alive` says
    so, when given (`stream_events`)."""
    if state.listener is None:
        raise TransientStorageError("event streams are not available: the api is starting")
    slot = state.streams.acquire(token_id)
    events = stream_events(
        state.require_store(),
        state.listener,
        state.stopping,
        followed,
        after,
        keepalive_s=state.settings.sse_keepalive_ms / 1000,
        max_lifetime_s=state.settings.sse_max_lifetime_s,
        alive=alive,
    )
    return StreamingResponse(
        slot.held_by(events),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def receipts_page(
    store: Store, followed: Followed[S], after: int, limit: int, max_bytes: int
) -> tuple[list[dict[str, Any]], int]:
    """Up to `limit` receipts past `after` as the caller sees them, and the seq the next page
    starts after. A page also ends before `max_bytes` (holding at least one receipt).

    The receipts are read `FIRST_READ` first, then as many as the rest of `max_bytes` holds
    at the size of those shown: a page of large receipts reads about what it shows. It read
    `limit` of them whatever their size (an hour of a command's output, 7 000 receipts of
    8 KB, was read whole for a 4 MiB page of 513, holding the event loop ~0.9 s a request)."""
    budget = max_bytes
    shown: list[dict[str, Any]] = []
    last_seq = after
    wanted = min(limit, FIRST_READ)
    while wanted > 0:
        batch = await store.read_stream(followed.stream, last_seq, wanted)
        for receipt in batch:
            data = followed.shown(receipt)
            budget -= json_size(data)
            if shown and budget < 0:
                return shown, last_seq
            shown.append(data)
            last_seq = receipt.seq
        if len(batch) < wanted:
            break
        each = (max_bytes - budget) / len(shown)
        wanted = min(limit - len(shown), int(budget / each) + 1)
    return shown, last_seq


async def events_response(
    asked: ReceiptsAsked,
    state: ApiState,
    caller: Principal,
    followed: Followed[S],
    head: dict[str, Any],
) -> Response:
    """A stream's receipts past `after` (or `Last-Event-ID`, which wins): live SSE when the
    request asks for it, else one JSON page `{**head, receipts, lastSeq}`."""
    resume = parse_last_event_id(asked.request.headers.get("last-event-id"), asked.after)
    followed = as_seen_by(caller, followed)
    if wants_stream(asked.request):
        return stream_response(state, caller.token_id, followed, resume)
    receipts, last_seq = await receipts_page(
        state.require_store(), followed, resume, asked.limit, state.settings.max_response_bytes
    )
    return JSONResponse({**head, "receipts": receipts, "lastSeq": last_seq})
