"""Session routes: the owner session's stream (`sessions/<id>`), where agent-job wakeups land."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import Response

from receipts.agent_jobs import lifecycle
from receipts.agent_jobs.model import session_stream
from roles.api.auth import JOBS_READ, Principal
from roles.api.deps import ApiError, ApiState, Caller, State, require_scope
from roles.api.schema import SessionEventsPage
from roles.api.sse import Asked, Followed, events_response, events_route

router = APIRouter(tags=["sessions"])

SessionId = Annotated[str, Path(alias="sessionId", description="The owner session id")]


async def visible_session(state: ApiState, caller: Principal, session_id: str) -> None:
    """Pass when the caller may read the owner session; another organization's (or one no
    agent job named) is 404."""
    require_scope(caller, JOBS_READ)
    owner = await lifecycle.session_organization(state.require_store(), session_id)
    if owner is None or not caller.sees(owner):
        raise ApiError(404, "not_found", f"no session {session_id!r}", field="sessionId")


@events_route(
    router,
    "/sessions/{sessionId}/events",
    "A session has no last receipt: it stays open.",
    response_model=SessionEventsPage,
)
async def get_session_events(
    asked: Asked, state: State, caller: Caller, session_id: SessionId
) -> Response:
    """The owner session's receipts (wakeups) in order; with `Accept: text/event-stream` a live,
    resumable stream (`Last-Event-ID`)."""
    await visible_session(state, caller, session_id)
    stream = session_stream(session_id)
    head = {"sessionId": session_id, "stream": stream}
    followed: Followed[None] = Followed(stream)
    return await events_response(asked, state, caller, followed, head)
