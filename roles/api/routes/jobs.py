"""The jobs resource: enqueue, list, read, events (JSON or live SSE) and commands.

Admission checks live in `roles.api.admission`, body reading in `roles.api.body`, streams in
`roles.api.sse`.

Job ids are scoped by organization (docs/design.md §4): an organization names its jobs by its own ids
and sees them under those ids; the runtime's id (`<id>~<organization tag>`) names the stream
and the workflows, and is what an admin token sees and names.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from opentelemetry import trace

from receipts import jobs as jobmodel
from receipts import metric_counts, reads
from receipts.enqueue import JOB_ID_PATTERN, EnqueueRequest, parse_enqueue
from receipts.enqueue_request import cap_timeout
from receipts.jobs import LANES, STATUSES, Job
from receipts.kinds import (
    CONTRACTS,
    KINDS,
    KINDS_WITHOUT_AUTH,
    MAX_ID_LENGTH,
    NON_BLANK,
)
from receipts.objectives import store as objectives
from receipts.tenancy import scoped_id
from roles.api.admission import (
    check_agent,
    check_command_rights,
    check_gateway,
    org_caps,
)
from roles.api.auth import COMMANDS_RUN, JOBS_READ, JOBS_WRITE, Principal
from roles.api.body import (
    check_declared_length,
    choice,
    decode_cursor,
    encode_cursor,
    job_path,
    keyed_id,
    read_json_body,
)
from roles.api.deps import (
    ApiError,
    ApiState,
    Caller,
    JobId,
    State,
    request_caller,
    require_scope,
    shown_id,
    takes_query,
    visible_job,
)
from roles.api.documented import JobStreamEnd
from roles.api.gate import admitted
from roles.api.schema import (
    EnqueueAccepted,
    EventsPage,
    JobList,
    JobView,
    errors_documented,
    job_view,
    json_body_documented,
    shown_receipt,
)
from roles.api.sse import (
    Asked,
    Followed,
    events_response,
    events_route,
    last_shown,
    within_budget,
)
from roles.infra.tracing import caller_context, current_traceparent, trace_id_of

log = logging.getLogger("roles.api.app")
_tracer = trace.get_tracer("receipt.api")

LIST_QUERY: tuple[str, ...] = (
    "status",
    "agentId",
    "lane",
    "sessionKey",
    "kind",
    "organizationId",
    "limit",
    "cursor",
)

router = APIRouter(tags=["jobs"])


@router.post(
    "/agents/{agentId}/jobs",
    status_code=202,
    response_model=EnqueueAccepted,
    responses=errors_documented(400, 401, 403, 404, 409, 413, 415, 422, 429, 503),
    openapi_extra=json_body_documented("EnqueueBody"),
    dependencies=[takes_query()],
)
async def post_job(
    request: Request,
    state: State,
    caller: Caller,
    agent_id: Annotated[
        str,
        Path(
            alias="agentId",
            max_length=MAX_ID_LENGTH,
            pattern=NON_BLANK,
            description="The agent that runs the job",
        ),
    ],
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            pattern=JOB_ID_PATTERN,
            description="Makes a post without `jobId` retryable: the same key names the same job",
        ),
    ] = None,
) -> JSONResponse:
    """Enqueue a job (202). An idempotent re-post, or a `steer` absorbed into an active job,
    also answers 202 with that job; `outcome` says which."""
    return await enqueue_post(request, state, caller, agent_id, idempotency_key)


async def enqueue_front(
    request: Request, agent_id: str, idempotency_key: str | None
) -> JSONResponse:
    """The enqueue as the enqueue gate answers a well-formed post (roles/api/gate.py `Serve`):
    this route's code, with the caller found as its `Caller` dependency finds it."""
    state: ApiState = request.app.state.api
    caller = request_caller(request, None)  # the gate admitted the token, or the API is open
    return await enqueue_post(request, state, caller, agent_id, idempotency_key)


async def enqueue_post(
    request: Request,
    state: ApiState,
    caller: Principal,
    agent_id: str,
    idempotency_key: str | None,
) -> JSONResponse:
    """The enqueue's answer, for a caller, path and header already validated: by this route's
    parameters, or by the enqueue gate, which answers a well-formed post itself without the
    router and the dependencies (roles/api/gate.py)."""
    require_scope(caller, JOBS_WRITE)
    settings = state.settings
    # A body declared too large is refused before it takes one of the organization's tokens.
    check_declared_length(request, settings.max_body_bytes)
    if admitted(request) is None:  # else the enqueue gate (roles/api/gate.py) took the token
        await state.org_limits.admit_paced(caller.organization_id)
    body = await read_json_body(request, settings.max_body_bytes, state.json_limits)
    enqueue_request = parse_enqueue(agent_id, body, text_checked=True)
    check_agent(settings, agent_id)
    organization_id = enqueue_request.organization_id
    if enqueue_request.kind in KINDS_WITHOUT_AUTH and not caller.admin:
        # The watchdog scans every organization's objectives: the runtime's own kind.
        raise ApiError(
            403,
            "forbidden",
            f"{enqueue_request.kind} is the runtime's own kind (its Schedule enqueues it); "
            "only an admin token may post it",
            field="payload.kind",
        )
    if not caller.admin and organization_id != caller.organization_id:
        raise ApiError(
            403,
            "forbidden",
            "payload.authContext.organizationId is not the token's organization",
            field="payload.authContext.organizationId",
        )
    enqueue_request = await _scoped_objective(state, enqueue_request)
    check_command_rights(caller, settings, agent_id, enqueue_request)
    check_gateway(settings, enqueue_request)
    # `timeoutMs` clamped to the operator's cap: a job cannot hold a worker slot for longer.
    enqueue_request = cap_timeout(enqueue_request, settings.max_timeout_ms)
    caps = org_caps(settings, organization_id) if organization_id is not None else None
    client_id = enqueue_request.job_id
    if client_id is None:
        client_id = keyed_id(idempotency_key)
    new_job_id = client_id is None
    if client_id is None:
        client_id = str(uuid.uuid4())
    # The caller's `traceparent` is the parent of the job's trace (README, "Traces").
    with _tracer.start_as_current_span(
        "receipt.enqueue",
        context=caller_context(request.headers),
        attributes={"receipt.agent_id": agent_id},
    ):
        traceparent = current_traceparent()
        enqueue_request = dataclasses.replace(
            enqueue_request,
            job_id=scoped_id(organization_id, client_id),
            new_job_id=new_job_id,
            max_commands=settings.max_commands_per_job,
            max_command_bytes=settings.max_command_bytes,
            may_steer_commands=caller.can(COMMANDS_RUN),
            trace_id=trace_id_of(traceparent),
            traceparent=traceparent,
        )
        result = await state.require_enqueuer().enqueue(enqueue_request, caps)
        job = result.job
        metric_counts.job_enqueued(
            job.lane, job.kind, job.agent_id, result.outcome, result.idempotency_mismatch
        )
        log.info(
            "job enqueued",
            extra={
                "event": "api.enqueued",
                "jobId": job.job_id,
                "agentId": job.agent_id,
                "outcome": result.outcome,
            },
        )
    shown = shown_id(caller, job)
    content = {
        "job": job_view(job, shown),
        "outcome": result.outcome,
        "async": {
            "jobId": shown,
            "stream": jobmodel.job_stream(shown),
            "jobUrl": job_path(request, shown),
            "eventsUrl": job_path(request, shown, "/events"),
            "status": job.status,
            "idempotencyMismatch": result.idempotency_mismatch,
        },
    }
    return JSONResponse(content, status_code=202)


async def _scoped_objective(state: ApiState, request: EnqueueRequest) -> EnqueueRequest:
    """The request with `payload.objectiveId` as the runtime names the organization's objective
    (`<id>~<tag>`, receipts/tenancy.py): an objective id, like a job id, names an objective of the
    caller's organization only. A kind that acts on an existing objective also finds one of the
    organization's created before ids were scoped (`objectives.runtime_id`)."""
    objective_id = request.payload.get("objectiveId")
    contract = CONTRACTS[request.kind]
    if not isinstance(objective_id, str) or not contract.objective_scoped:
        return request
    existing = contract.objective_required and request.kind != "factory.run"
    runtime = await objectives.runtime_id(
        state.require_store(), request.organization_id, objective_id, existing=existing
    )
    return dataclasses.replace(request, payload={**request.payload, "objectiveId": runtime})


@router.get(
    "/jobs",
    response_model=JobList,
    responses=errors_documented(401, 403, 422, 503),
    dependencies=[takes_query(*LIST_QUERY)],
)
async def list_jobs(
    state: State,
    caller: Caller,
    status: Annotated[str | None, Query(json_schema_extra={"enum": list(STATUSES)})] = None,
    agent_id: Annotated[
        str | None, Query(alias="agentId", min_length=1, max_length=MAX_ID_LENGTH)
    ] = None,
    lane: Annotated[str | None, Query(json_schema_extra={"enum": list(LANES)})] = None,
    session_key: Annotated[
        str | None, Query(alias="sessionKey", min_length=1, max_length=MAX_ID_LENGTH)
    ] = None,
    kind: Annotated[str | None, Query(json_schema_extra={"enum": list(KINDS)})] = None,
    organization_id: Annotated[
        str | None, Query(alias="organizationId", min_length=1, max_length=MAX_ID_LENGTH)
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(min_length=1, max_length=1000)] = None,
) -> JSONResponse:
    """List the caller's jobs, newest first, one page at a time (keyset cursor).

    A page also ends before `RECEIPT_MAX_RESPONSE_BYTES` (at least one job); `nextCursor`
    continues it.
    """
    require_scope(caller, JOBS_READ)
    filters = reads.JobFilters(
        organization_id=organization_id,
        status=choice(status, "status", STATUSES),
        agent_id=agent_id,
        lane=choice(lane, "lane", LANES),
        session_key=session_key,
        kind=choice(kind, "kind", KINDS),
    )
    page = await reads.jobs_page(
        state.require_store(), caller, filters, after=decode_cursor(cursor), limit=limit
    )
    views = within_budget(
        (job_view(job, shown_id(caller, job)) for job in page.items),
        state.settings.max_response_bytes,
    )
    last = last_shown(page.items, len(views), page.more)
    next_cursor = encode_cursor(last.created_at, last.job_id) if last else None
    return JSONResponse({"jobs": views, "nextCursor": next_cursor})


def followed_job(job: Job, shown: str) -> Followed[Job]:
    """A job's stream as a caller who knows the job as `shown` follows it: receipts redacted
    and named by `shown`, ending after the receipt that made the job terminal. `job` (its
    projection's row, read by the route) is folded on from its seq: a stream resumed at the
    head of a long history reads nothing behind it."""

    def end(state: Job) -> dict[str, Any] | None:
        return {"jobId": shown, "status": state.status} if state.terminal else None

    return Followed(
        jobmodel.job_stream(job.job_id),
        fold=jobmodel.apply,
        end=end,
        show=lambda receipt: shown_receipt(
            receipt, job.job_id, shown, job.organization_id if shown != job.job_id else None
        ),
        start=job,
        start_seq=job.seq,
    )


@events_route(
    router,
    "/jobs/{jobId:path}/events",
    "It ends with `event: end` after the terminal receipt.",
    409,
    end=JobStreamEnd,
    response_model=EventsPage,
)
async def job_events(asked: Asked, state: State, caller: Caller, job_id: JobId) -> Response:
    """A job's receipts in order; with `Accept: text/event-stream`, live until terminal.

    A JSON page also ends before `RECEIPT_MAX_RESPONSE_BYTES` (at least one receipt); `lastSeq`
    is where the next page starts.
    """
    require_scope(caller, JOBS_READ)
    job = await visible_job(state, caller, job_id)
    shown = shown_id(caller, job)
    head = {"jobId": shown, "stream": jobmodel.job_stream(shown), "status": job.status}
    return await events_response(asked, state, caller, followed_job(job, shown), head)


@router.get(
    "/jobs/{jobId:path}",
    response_model=JobView,
    responses=errors_documented(401, 403, 404, 409, 422, 503),
    dependencies=[takes_query()],
)
async def get_job(state: State, caller: Caller, job_id: JobId) -> JSONResponse:
    """The folded job with its route, contract worker group, attempt, lease and commands."""
    require_scope(caller, JOBS_READ)
    job = await visible_job(state, caller, job_id)
    return JSONResponse(job_view(job, shown_id(caller, job)))
