"""Agent-job routes: create, read, answer (organization tokens) and the admin console."""

from __future__ import annotations

import dataclasses
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse, Response

from receipts import metrics
from receipts.agent_jobs import interventions, lifecycle
from receipts.agent_jobs import model as agent_model
from receipts.agent_jobs import reads as agent_reads
from receipts.agent_jobs.lifecycle import CreateRequest
from receipts.agent_jobs.model import AgentJob
from receipts.agent_jobs.registry import AgentJobSettings, RegistryError, load_registry
from receipts.agent_jobs.requests import MAX_ID_LENGTH, parse_answer, parse_create
from receipts.errors import ConflictError, InvalidInput, NotFoundError
from roles.api.auth import COMMANDS_RUN, JOBS_READ, JOBS_WRITE, Principal
from roles.api.body import (
    choice,
    decode_cursor,
    encode_cursor,
    path_segment,
    read_optional_json_body,
)
from roles.api.deps import (
    ApiError,
    ApiState,
    Caller,
    State,
    read_json_body,
    require_scope,
    shown_view,
    too_many,
)
from roles.api.deps import takes_query as _takes_query
from roles.api.documented import AgentJobStreamEnd
from roles.api.errors import RETRY_AFTER_S
from roles.api.routes.sessions import runtime_session_id, visible_session
from roles.api.schema import (
    AgentJobAnswer,
    AgentJobEventsPage,
    AgentJobList,
    AgentJobView,
    errors_documented,
    json_body_documented,
)
from roles.api.sse import (
    Asked,
    Followed,
    events_response,
    events_route,
    last_shown,
    within_budget,
)
from roles.infra.tracing import caller_span

router = APIRouter(tags=["agent-jobs"])
log = logging.getLogger("roles.api.app")

AgentJobId = Annotated[str, Path(alias="agentJobId", description="The agent job id")]
LIST_QUERY = ("status", "agentId", "ownerSessionId", "organizationId", "limit", "cursor")
STATUS_QUERY = Query(json_schema_extra={"enum": list(agent_model.STATUSES)})

_ID = {"type": "string", "minLength": 1, "maxLength": 200}
_OPTIONAL_ID = {"anyOf": [_ID, {"type": "null"}]}
# The documented bodies are no stricter than the validation in receipts/agent_jobs/requests.py
# (which also refuses blank strings and '/' in agentId and ownerSessionId).
_REQUIRED_PROPERTIES: dict[str, Any] = {
    "agentId": _ID,
    "ownerSessionId": _ID,
    "sourceActorEventId": _ID,
    "sourceToolCallId": _ID,
    "replyRoute": {
        "type": "object",
        "additionalProperties": False,
        "required": ["binding", "channel"],
        "properties": {
            "binding": {"type": "string", "minLength": 1},
            "channel": {"type": "string", "minLength": 1},
            "thread": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
    },
    "input": {
        "type": "object",
        "additionalProperties": False,
        "minProperties": 1,
        "maxProperties": 1,
        "properties": {
            "prompt": {"type": "string", "minLength": 1},
            "command": {"type": "array", "minItems": 1, "items": {"type": "string"}},
        },
    },
}
CREATE_BODY = {
    "type": "object",
    "additionalProperties": False,
    "required": list(_REQUIRED_PROPERTIES),
    "properties": {
        **_REQUIRED_PROPERTIES,
        "workspaceTemplate": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "continuedFromJobId": _OPTIONAL_ID,
        "providerBinding": _OPTIONAL_ID,
        "userId": _OPTIONAL_ID,
        "organizationId": {
            "description": "Admin tokens only: the organization of the job",
            **_OPTIONAL_ID,
        },
    },
}
ANSWER_BODY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["answer"],
    "properties": {"answer": {}, "toolCallId": _OPTIONAL_ID},
}
CANCEL_BODY = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"reason": {"type": "string", "maxLength": 1000}},
}

# Published as components of the OpenAPI document under these names (roles/api/app.py).
NAMED_BODIES: dict[str, dict[str, Any]] = {
    "AgentJobCreateBody": CREATE_BODY,
    "AgentJobInputBody": ANSWER_BODY,
    "AgentJobCancelBody": CANCEL_BODY,
}


def _ok(code: int, text: str) -> dict[int | str, dict[str, Any]]:
    return {code: {"description": text, "model": AgentJobAnswer}}


def _path(request: Request, suffix: str) -> str:
    return f"{request.scope.get('root_path', '')}{suffix}"


def agent_job_view(
    job: AgentJob, request: Request | None = None, caller: Principal | None = None
) -> dict[str, Any]:
    """The agent job as the API shows it: its folded state, latest status and links; to an
    organization, its owner session by the id it chose (the runtime scopes it)."""
    view = job.to_json()
    # Its trace is its turns' (`traceId` on each turn's queue job), not a field of this view.
    view.pop("traceparent", None)
    view["latestStatus"] = job.latest_status()
    view["stream"] = agent_model.stream_of(job.agent_job_id)
    view["sessionStream"] = agent_model.session_stream(job.owner_session_id)
    if request is not None:
        quoted = path_segment(job.agent_job_id)
        # The session as the caller names it, then escaped: an organization's session `..`
        # is the runtime's `..~<tag>`, a dot segment only once the tag is taken off.
        session = shown_view(caller, job.owner_session_id) if caller else job.owner_session_id
        view["links"] = {
            "self": _path(request, f"/agent-jobs/{quoted}"),
            "events": _path(request, f"/agent-jobs/{quoted}/events"),
            "input": _path(request, f"/agent-jobs/{quoted}/input"),
            "sessionEvents": _path(request, f"/sessions/{path_segment(session)}/events"),
            "turnJob": (
                _path(request, f"/jobs/{path_segment(job.queue_job_id)}")
                if job.queue_job_id
                else None
            ),
        }
    return shown_view(caller, view) if caller is not None else view


async def visible_agent_job(state: ApiState, caller: Principal, agent_job_id: str) -> AgentJob:
    """The agent job if the caller may see it; another organization's looks like none (404)."""
    job = await lifecycle.get(state.require_store(), agent_job_id)
    if job is None or not caller.sees(job.organization_id):
        raise ApiError(404, "not_found", f"no agent job {agent_job_id!r}", field="agentJobId")
    return job


def require_admin(caller: Principal) -> None:
    if not caller.admin:
        raise ApiError(403, "forbidden", "the console needs an admin token")


def _checked_binding(settings: AgentJobSettings, create: CreateRequest) -> CreateRequest:
    """Refuse an agent the registry does not know, when this process can read the registry, and
    a provider binding other than the agent's (a binding decides whose model keys a turn
    spends, so a tenant does not choose it); the create saves the agent's binding, which every
    turn of the job then uses. A create naming a binding the api cannot check is refused (the
    worker uses a saved binding as it is): 422 when no registry is configured here (name none:
    the turn takes the agent's), 503 while the configured one cannot be read."""
    named = create.provider_binding
    if settings.agents_file is None:
        if named is not None:
            raise InvalidInput(
                "providerBinding",
                "providerBinding can be named only where the api reads the agents registry "
                "(RECEIPT_AGENTS_FILE is not set here); name none and each turn uses the agent's",
                (),
            )
        return create
    try:
        registry = load_registry(settings.agents_file)
    except RegistryError as exc:
        if named is None:
            return create  # the turn reports a broken registry; the job saves no binding
        metrics.API_REGISTRY_UNREADABLE.inc()
        log.warning(
            "an agent job naming a provider binding was refused: the agents registry is unreadable",
            extra={"event": "api.agents_registry_unreadable", "error": str(exc)},
        )
        raise ApiError(
            503,
            "registry_unavailable",
            "the agents registry cannot be read to check providerBinding; retry later",
            field="providerBinding",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        ) from exc
    agent = registry.get(create.agent_id)
    if agent is None:
        known = tuple(sorted(registry.agents))
        raise InvalidInput(
            "agentId", f"agentId {create.agent_id!r} is not in the agents registry", known
        )
    binding = agent.provider_binding
    if named not in (None, binding):
        raise InvalidInput(
            "providerBinding",
            f"providerBinding must be the agent's ({binding or 'it names none'})",
            (binding,) if binding else (),
        )
    return dataclasses.replace(create, provider_binding=binding)


@router.post(
    "/agent-jobs",
    response_model=AgentJobAnswer,
    status_code=201,
    responses={
        **_ok(200, "A retried create: the job it made"),
        **errors_documented(400, 401, 403, 409, 413, 415, 422, 429),
        503: {
            **errors_documented(503)[503],
            "description": "Database unavailable, or (a create naming `providerBinding`) the "
            "agents registry unreadable; retry after `Retry-After` seconds",
        },
    },
    openapi_extra=json_body_documented("AgentJobCreateBody"),
)
async def create_agent_job(request: Request, state: State, caller: Caller) -> JSONResponse:
    """Create a background agent job for the token's organization (201; 200 for a retried
    create of the same `sourceToolCallId` in the same owner session). An agent job's turns run
    commands on the codex workers: the token needs `jobs:write` and `commands:run`."""
    require_scope(caller, JOBS_WRITE)
    require_scope(caller, COMMANDS_RUN)
    # As an enqueue: the organization's rate.
    await state.org_limits.admit_paced(caller.organization_id)
    body = await read_json_body(request, state.settings.max_body_bytes, state.json_limits)
    if not isinstance(body, dict):
        raise InvalidInput("body", "the request body must be a JSON object")
    organization_id = caller.organization_id
    named = body.pop("organizationId", None)
    if caller.admin and organization_id is None:
        if not isinstance(named, str) or not named.strip() or len(named) > MAX_ID_LENGTH:
            raise InvalidInput(
                "organizationId",
                "an admin token must name the organizationId of the job (at most "
                f"{MAX_ID_LENGTH} characters)",
            )
        organization_id = named
    elif named is not None and named != organization_id:
        raise ApiError(
            403,
            "forbidden",
            "organizationId is not the token's organization",
            field="organizationId",
        )
    assert organization_id is not None
    create = _checked_binding(state.agent_jobs, parse_create(body, organization_id))
    session = await runtime_session_id(
        state.require_store(), organization_id, create.owner_session_id
    )
    create = dataclasses.replace(create, owner_session_id=session)
    # The caller's `traceparent` is the parent of the trace its turns' queue jobs share.
    with caller_span("receipt.agent_job.create", request.headers) as traceparent:
        try:
            job, created = await lifecycle.create(
                state.require_store(),
                dataclasses.replace(create, traceparent=traceparent),
                max_open=None if caller.admin else state.settings.org_max_queued,
            )
        except lifecycle.AtCap as exc:
            raise too_many(str(exc), RETRY_AFTER_S) from exc
        except lifecycle.LiveTurnRunning as exc:
            raise ApiError(409, "live_turn_running", str(exc), field="continuedFromJobId") from exc
        except ConflictError as exc:
            raise ApiError(409, "conflict", str(exc), field="ownerSessionId") from exc
    return JSONResponse(
        {"agentJob": agent_job_view(job, request, caller), "created": created},
        status_code=201 if created else 200,
    )


@router.get(
    "/sessions/{sessionId}/agent-jobs",
    response_model=AgentJobList,
    responses=errors_documented(401, 403, 404, 409, 422, 503),
    dependencies=[_takes_query("status", "agentId", "limit", "cursor")],
)
async def list_session_agent_jobs(
    request: Request,
    state: State,
    caller: Caller,
    session_id: Annotated[str, Path(alias="sessionId", description="The owner session id")],
    status: Annotated[str | None, STATUS_QUERY] = None,
    agent_id: Annotated[str | None, Query(alias="agentId", max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=1000)] = None,
) -> JSONResponse:
    """The owner session's agent jobs, newest first (keyset cursor). (A list of every job of
    an organization is the console's, for admin tokens.)"""
    runtime = await visible_session(state, caller, session_id)
    return await agent_jobs_page(
        request, state, caller, status, agent_id, runtime, None, limit, cursor
    )


async def agent_jobs_page(
    request: Request,
    state: ApiState,
    caller: Principal,
    status: str | None,
    agent_id: str | None,
    owner_session_id: str | None,
    organization_id: str | None,
    limit: int,
    cursor: str | None,
) -> JSONResponse:
    page = await agent_reads.jobs_page(
        state.require_store(),
        caller,
        organization_id=organization_id,
        status=choice(status, "status", agent_model.STATUSES),
        agent_id=agent_id,
        owner_session_id=owner_session_id,
        after=decode_cursor(cursor),
        limit=limit,
    )
    views = within_budget(
        (agent_job_view(j, request, caller) for j in page.items),
        state.settings.max_response_bytes,
    )
    last = last_shown(page.items, len(views), page.more)
    next_cursor = encode_cursor(last.created_at, last.agent_job_id) if last else None
    return JSONResponse({"agentJobs": views, "nextCursor": next_cursor})


@router.get(
    "/agent-jobs/{agentJobId}",
    response_model=AgentJobView,
    responses=errors_documented(401, 403, 404, 422, 503),
    dependencies=[_takes_query()],
)
async def get_agent_job(
    request: Request, state: State, caller: Caller, agent_job_id: AgentJobId
) -> JSONResponse:
    """The agent job: status, attempt, turn, latest status (pending tool call while waiting)."""
    require_scope(caller, JOBS_READ)
    return JSONResponse(
        agent_job_view(await visible_agent_job(state, caller, agent_job_id), request, caller)
    )


def followed_agent_job(job: AgentJob, caller: Principal) -> Followed[AgentJob]:
    """An agent job's stream, ending once the job is `succeeded`, `failed` or `stopped` (a job
    waiting on its user is not finished); its receipts as the caller sees them (an
    organization's session ids as it chose them). `job` (its projection's row, read by the
    route) is folded on from its seq: a resumed stream reads nothing behind it."""
    agent_job_id = job.agent_job_id

    def end(job: AgentJob) -> dict[str, Any] | None:
        return {"agentJobId": agent_job_id, "status": job.status} if job.terminal else None

    return Followed(
        agent_model.stream_of(agent_job_id),
        fold=agent_model.apply,
        end=end,
        show=lambda receipt: shown_view(caller, receipt),
        start=job,
        start_seq=job.seq,
    )


@events_route(
    router,
    "/agent-jobs/{agentJobId}/events",
    "It ends with `event: end` once the job is finished.",
    end=AgentJobStreamEnd,
    response_model=AgentJobEventsPage,
)
async def agent_job_events(
    asked: Asked, state: State, caller: Caller, agent_job_id: AgentJobId
) -> Response:
    """The receipts of `agent-jobs/<id>` after `after`; with `Accept: text/event-stream`, live
    until the job is finished."""
    require_scope(caller, JOBS_READ)
    job = await visible_agent_job(state, caller, agent_job_id)
    head = {
        "agentJobId": job.agent_job_id,
        "stream": agent_model.stream_of(job.agent_job_id),
        "status": job.status,
    }
    followed = followed_agent_job(job, caller)
    return await events_response(asked, state, caller, followed, head)


@router.post(
    "/agent-jobs/{agentJobId}/input",
    response_model=AgentJobAnswer,
    status_code=202,
    responses=errors_documented(400, 401, 403, 404, 409, 413, 415, 422, 429, 503),
    openapi_extra=json_body_documented("AgentJobInputBody"),
    dependencies=[_takes_query()],
)
async def answer_agent_job(
    request: Request, state: State, caller: Caller, agent_job_id: AgentJobId
) -> JSONResponse:
    """Answer a job waiting for input (202, the job still `waiting_on_user`, `answered`); the
    dispatcher continues it as soon as its agent has a free slot (and its organization a free
    share of the codex workers). The answer is the input of a turn that runs the agent's
    command: the token needs `commands:run`, as a follow-up to the turn does."""
    require_scope(caller, JOBS_WRITE)
    require_scope(caller, COMMANDS_RUN)
    answer, tool_call_id = parse_answer(
        await read_json_body(request, state.settings.max_body_bytes, state.json_limits)
    )
    await visible_agent_job(state, caller, agent_job_id)
    try:
        job = await interventions.answer(
            state.require_store(), agent_job_id, answer=answer, tool_call_id=tool_call_id
        )
    except interventions.NotWaiting as exc:
        raise ApiError(409, "not_waiting", str(exc)) from exc
    except NotFoundError as exc:
        raise ApiError(404, "not_found", str(exc), field="agentJobId") from exc
    return JSONResponse({"agentJob": agent_job_view(job, request, caller)}, status_code=202)


@router.post(
    "/agent-jobs/{agentJobId}/cancel",
    response_model=AgentJobAnswer,
    status_code=202,
    responses=errors_documented(400, 401, 403, 404, 409, 413, 415, 422, 429, 503),
    openapi_extra=json_body_documented("AgentJobCancelBody", required=False),
    dependencies=[_takes_query()],
)
async def cancel_agent_job(
    request: Request, state: State, caller: Caller, agent_job_id: AgentJobId
) -> JSONResponse:
    """Drive the job to `stopped` at once, its slot free (202; 409 when it is already finished).
    A live turn is not yanked out from under its worker: it finishes or fails on its own, and
    nothing it does afterwards reaches the job or its owner session (a turn not yet started is
    canceled with the job)."""
    require_scope(caller, JOBS_WRITE)
    return await cancel_answer(request, state, caller, agent_job_id, "canceled by request")


async def cancel_answer(
    request: Request, state: State, caller: Principal, agent_job_id: str, reason: str
) -> JSONResponse:
    body = await read_optional_json_body(request, state.settings.max_body_bytes)
    if body is not None:
        if not isinstance(body, dict) or set(body) - {"reason"}:
            raise InvalidInput("body", "the body may only carry 'reason'", ("reason",))
        given = body.get("reason")
        if given is not None:
            if not isinstance(given, str) or len(given) > 1000:
                raise InvalidInput("reason", "reason must be a string of at most 1000 characters")
            reason = given
    await visible_agent_job(state, caller, agent_job_id)
    try:
        job = await interventions.cancel(state.require_store(), agent_job_id, reason=reason)
    except interventions.AlreadyTerminal as exc:
        raise ApiError(409, "terminal_state", str(exc)) from exc
    except NotFoundError as exc:
        raise ApiError(404, "not_found", str(exc), field="agentJobId") from exc
    return JSONResponse({"agentJob": agent_job_view(job, request, caller)}, status_code=202)
