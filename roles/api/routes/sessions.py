"""Session routes: the owner session's stream (`sessions/<id>`), where agent-job wakeups land."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import Response

from receipts.agent_jobs import lifecycle
from receipts.agent_jobs.model import session_stream
from receipts.store import Store
from receipts.tenancy import scoped_id
from roles.api.auth import JOBS_READ, Principal
from roles.api.deps import ApiError, ApiState, Caller, State, require_scope, shown_view
from roles.api.schema import SessionEventsPage
from roles.api.sse import Asked, Followed, events_response, events_route

router = APIRouter(tags=["sessions"])

SessionId = Annotated[str, Path(alias="sessionId", description="The owner session id")]


async def runtime_session_id(store: Store, organization_id: str, session_id: str) -> str:
    """The runtime's id of the owner session `organization_id` names `session_id`: scoped by
    organization as a job id is (`<id>~<tag>`), so two organizations' `slack-C042` are two
    sessions and one can neither take nor probe the other's. A session an agent job of this
    organization named before ids were scoped keeps its id."""
    if await lifecycle.session_organization(store, session_id) == organization_id:
        return session_id
    return scoped_id(organization_id, session_id)


async def visible_session(state: ApiState, caller: Principal, session_id: str) -> str:
    """The runtime's id of the owner session the caller names `session_id` (an admin names the
    runtime's ids); another organization's (or one no agent job named) is 404."""
    require_scope(caller, JOBS_READ)
    store = state.require_store()
    runtime = session_id
    owner = await lifecycle.session_organization(store, session_id)
    if not caller.admin and caller.organization_id is not None:
        if owner != caller.organization_id:  # not one it named before ids were scoped
            runtime = scoped_id(caller.organization_id, session_id)
            owner = await lifecycle.session_organization(store, runtime)
    elif owner is None:
        # An admin may name a session by an organization's own id, when one organization has it.
        named = await lifecycle.sessions_named(store, session_id)
        if len(named) > 1:
            raise ApiError(
                409,
                "ambiguous_session_id",
                f"several organizations have a session {session_id!r}: name it by its runtime "
                "id (<id>~<tag>)",
                field="sessionId",
            )
        if named:
            runtime = named[0]
            owner = await lifecycle.session_organization(store, runtime)
    if owner is None or not caller.sees(owner):
        raise ApiError(404, "not_found", f"no session {session_id!r}", field="sessionId")
    return runtime


@events_route(
    router,
    "/sessions/{sessionId}/events",
    "A session has no last receipt: it stays open.",
    409,
    response_model=SessionEventsPage,
)
async def get_session_events(
    asked: Asked, state: State, caller: Caller, session_id: SessionId
) -> Response:
    """The owner session's receipts (wakeups) in order; with `Accept: text/event-stream` a live,
    resumable stream (`Last-Event-ID`)."""
    runtime = await visible_session(state, caller, session_id)
    stream = session_stream(runtime)
    head = shown_view(caller, {"sessionId": runtime, "stream": stream})
    followed: Followed[None] = Followed(stream, show=lambda receipt: shown_view(caller, receipt))
    return await events_response(asked, state, caller, followed, head)
