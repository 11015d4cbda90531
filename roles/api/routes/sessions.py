"""Session routes: the owner session's stream (`sessions/<id>`), where agent-job wakeups land."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from receipts.agent_jobs import lifecycle
from receipts.agent_jobs.model import session_stream
from receipts.errors import TransientStorageError
from receipts.listen import RECONNECTED, Listener
from receipts.store import Store
from roles.api.auth import JOBS_READ
from roles.api.deps import ApiError, Caller, State, require_scope
from roles.api.deps import takes_query as _takes_query
from roles.api.schema import errors_documented
from roles.api.sse import (
    _STOP,
    SSE_PAGE,
    SSE_RETRY_MS,
    _next_notice,
    parse_last_event_id,
    sse_receipt,
)

log = logging.getLogger("roles.api.routes.sessions")
router = APIRouter(tags=["sessions"])

SessionId = Annotated[str, Path(alias="sessionId", description="The owner session id")]


async def session_events(
    store: Store,
    listener: Listener,
    stopping: asyncio.Event,
    stream: str,
    after: int,
    keepalive_s: float,
) -> AsyncIterator[str]:
    """Yield a session stream's receipts past `after` as SSE events, live, until the client
    leaves or the server stops (a session has no terminal receipt). Resumable: `id` is the seq.

    The subscription opens before the backlog is read, so no append falls between the two.
    """
    last = after
    async with listener.subscribe(stream) as notices:
        yield f"retry: {SSE_RETRY_MS}\n\n"
        stop = asyncio.ensure_future(stopping.wait())
        try:
            while True:
                try:
                    batch = await store.read_stream(stream, last, SSE_PAGE)
                except TransientStorageError as exc:
                    log.warning(
                        "session stream lost the database",
                        extra={
                            "event": "api.sse_storage_lost",
                            "stream": stream,
                            "error": str(exc),
                        },
                    )
                    return
                for receipt in batch:
                    last = receipt.seq
                    yield sse_receipt(receipt)
                if len(batch) == SSE_PAGE:
                    continue
                while True:
                    notice = await _next_notice(notices, stop, keepalive_s)
                    if notice is None:
                        yield ": keepalive\n\n"
                    elif notice is _STOP:
                        return
                    elif notice is RECONNECTED or (notice.stream == stream and notice.seq > last):
                        break
        finally:
            stop.cancel()


@router.get(
    "/sessions/{sessionId}/events",
    responses={
        200: {
            "description": "The session's receipts as JSON, or with `Accept: text/event-stream` "
            "a live stream: one event per receipt (`id` = seq, `data` = the receipt).",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        **errors_documented(401, 404, 422, 503),
    },
    openapi_extra={
        "parameters": [
            {
                "name": "Last-Event-ID",
                "in": "header",
                "required": False,
                "description": "Resume after this seq; wins over `after`",
                "schema": {"type": "integer", "minimum": 0},
            }
        ]
    },
    dependencies=[_takes_query("after", "limit")],
)
async def get_session_events(
    request: Request,
    state: State,
    caller: Caller,
    session_id: SessionId,
    after: Annotated[int, Query(ge=0, description="Only receipts with seq > after")] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> Any:
    """The owner session's receipts (wakeups) in order; with `Accept: text/event-stream` a live,
    resumable stream (`Last-Event-ID`)."""
    require_scope(caller, JOBS_READ)
    store = state.require_store()
    owner = await lifecycle.session_organization(store, session_id)
    if owner is None or not caller.sees(owner):
        raise ApiError(404, "not_found", f"no session {session_id!r}", field="sessionId")
    resume = parse_last_event_id(request.headers.get("last-event-id"), after)
    stream = session_stream(session_id)
    if "text/event-stream" in request.headers.get("accept", ""):
        assert state.listener is not None
        events = session_events(
            store,
            state.listener,
            state.stopping,
            stream,
            resume,
            keepalive_s=state.settings.sse_keepalive_ms / 1000,
        )
        return StreamingResponse(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    receipts = await store.read_stream(stream, resume, limit)
    body = {
        "sessionId": session_id,
        "stream": stream,
        "receipts": [r.to_json() for r in receipts],
        "lastSeq": receipts[-1].seq if receipts else resume,
    }
    return JSONResponse(body)
