"""Objective routes: create (enqueues `factory.run`), list, show, follow and cancel objectives.

Tenant rules are the jobs': a caller sees only its organization's objectives (another
organization's is 404); admin sees all.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse, Response

from receipts import metric_counts
from receipts import operations as ops
from receipts.enqueue import enqueue, parse_enqueue
from receipts.errors import InvalidInput
from receipts.executables import objective_commands
from receipts.jobs import Job
from receipts.kinds import check_objective_id
from receipts.objectives import model as objective_model
from receipts.objectives import store as objectives
from receipts.objectives.graph import OBJECTIVE_FIELDS, parse_objective
from receipts.objectives.model import (
    STATUSES,
    ObjectiveState,
    ObjectiveSummary,
    objective_stream,
    run_job_id,
)
from receipts.store import Store
from receipts.tenancy import TENANT_SEPARATOR, scoped_id
from roles.api.admission import check_executables, org_caps
from roles.api.auth import COMMANDS_RUN, JOBS_READ, JOBS_WRITE, Principal
from roles.api.body import (
    IdempotencyKey,
    choice,
    decode_cursor,
    encode_cursor,
    job_path,
    keyed_id,
    path_segment,
    read_json_body,
    read_optional_json_body,
)
from roles.api.body import json_object as _object
from roles.api.deps import ApiError, ApiState, Caller, State, require_scope, shown_id, shown_view
from roles.api.deps import takes_query as _takes_query
from roles.api.documented import ObjectiveStreamEnd
from roles.api.schema import (
    ObjectiveAccepted,
    ObjectiveCancelAccepted,
    ObjectiveEventsPage,
    ObjectiveList,
    ObjectiveView,
    errors_documented,
    job_view,
    json_body_documented,
)
from roles.api.sse import Asked, Followed, events_response, events_route
from roles.infra.tracing import caller_span, trace_id_of

log = logging.getLogger("roles.api.routes.objectives")

router = APIRouter(tags=["objectives"])
ObjectiveId = Annotated[str, Path(alias="objectiveId", description="The objective id")]
CREATE_FIELDS: tuple[str, ...] = (*OBJECTIVE_FIELDS, "authContext")
CANCEL_FIELDS: tuple[str, ...] = ("reason",)


def _paths(request: Request, objective_id: str) -> dict[str, str]:
    base = f"{request.scope.get('root_path', '')}/objectives/{path_segment(objective_id)}"
    return {"objectiveUrl": base, "eventsUrl": f"{base}/events", "cancelUrl": f"{base}/cancel"}


async def _visible(
    state: ApiState, caller: Principal, objective_id: str, *, reading: bool = True
) -> ObjectiveState:
    """The objective the caller names `objective_id` (an organization names its own, as it does
    its jobs; an admin as `_runtime` says); 404 for one it may not see, saying so when its run
    job has not created it (yet). `reading`: the caller must hold `jobs:read` (a cancel needs
    `jobs:write` only, as a job's commands do)."""
    if reading:
        require_scope(caller, JOBS_READ)
    store = state.require_store()
    runtime = await _runtime(store, caller, objective_id)
    objective = await objectives.get(store, runtime)
    if objective is None or not caller.sees(objective.organization_id):
        message = f"no objective {objective_id!r}"
        run = await _run_job(store, caller, runtime) if objective is None else None
        if run is not None:
            ended = "ended" if run.terminal else "is"
            message += f" yet: its run job {shown_id(caller, run)!r} {ended} {run.status}" + (
                " without creating it" if run.terminal else ", and creates it when it runs"
            )
        raise ApiError(404, "not_found", message, field="objectiveId")
    return objective


async def _runtime(store: Store, caller: Principal, objective_id: str) -> str:
    """The runtime id of the objective `caller` names `objective_id`: an organization names its
    own; an admin names runtime ids (`<id>~<tag>`), or an organization's own id while one
    organization has it (409 `ambiguous_objective_id` when several do)."""
    if not caller.admin:
        return await objectives.runtime_id(store, caller.organization_id, objective_id)
    if TENANT_SEPARATOR in objective_id or await objectives.get(store, objective_id) is not None:
        return objective_id
    named = await objectives.named(store, objective_id)
    if len(named) > 1:
        raise ApiError(
            409,
            "ambiguous_objective_id",
            f"several organizations have an objective {objective_id!r}: name it by its "
            "runtime id (<id>~<tag>)",
            field="objectiveId",
        )
    return named[0] if named else objective_id


async def _run_job(store: Store, caller: Principal, runtime: str) -> Job | None:
    """The `factory.run` job of the objective `runtime` names, when the caller may see it."""
    run = await store.get_job(run_job_id(runtime))
    return run if run is not None and caller.sees(run.organization_id) else None


def _auth_context(body: dict[str, Any], caller: Principal) -> dict[str, Any]:
    auth = body.get("authContext")
    if auth is None:
        if caller.organization_id is None:
            raise InvalidInput(
                "authContext",
                "authContext {userId, organizationId} is required for a caller without an "
                "organization (admin or open mode)",
            )
        return {"userId": "api", "organizationId": caller.organization_id}
    if not isinstance(auth, dict):
        raise InvalidInput("authContext", "authContext must be an object")
    if not caller.admin and auth.get("organizationId") != caller.organization_id:
        raise ApiError(
            403,
            "forbidden",
            "authContext.organizationId is not the token's organization",
            field="authContext.organizationId",
        )
    return auth


@router.post(
    "/objectives",
    status_code=202,
    response_model=ObjectiveAccepted,
    responses=errors_documented(400, 401, 403, 409, 413, 415, 422, 429, 503),
    dependencies=[_takes_query()],
    openapi_extra=json_body_documented("ObjectiveBody"),
)
async def post_objective(
    request: Request, state: State, caller: Caller, idempotency_key: IdempotencyKey = None
) -> JSONResponse:
    """Create an objective: validates the graph (422 naming the problem, nothing written) and
    enqueues its `factory.run` job (202 with the objective's URLs). Its tasks run commands, so
    the token needs `jobs:write` and `commands:run`. A body without `objectiveId` sent with an
    `Idempotency-Key` names the objective by the key: sent again, it finds it (`existing`);
    another objective under that key is 409 `conflict`."""
    require_scope(caller, JOBS_WRITE)
    require_scope(caller, COMMANDS_RUN)
    # An enqueue: the organization's rate.
    await state.org_limits.admit_paced(caller.organization_id)
    raw = await read_json_body(request, state.settings.max_body_bytes, state.json_limits)
    body = _object(raw, CREATE_FIELDS)
    auth = _auth_context(body, caller)
    raw = {k: v for k, v in body.items() if k != "authContext"}
    spec = parse_objective(raw, "")  # the body is the objective: errors name its fields
    objective_id = spec.objective_id or keyed_id(idempotency_key) or str(uuid.uuid4())
    raw["objectiveId"] = objective_id
    parsed = parse_enqueue(
        "factory",
        {
            "payload": {
                "kind": "factory.run",
                "objectiveId": objective_id,
                "authContext": auth,
                "objective": raw,
            },
        },
    )
    commands = objective_commands(raw, "")
    check_executables(state.settings, parsed.organization_id, commands)
    # Scoped by organization as a job id is (receipts/tenancy.py): the run job is named after it.
    runtime = scoped_id(parsed.organization_id, objective_id)
    enqueue_request = dataclasses.replace(
        parsed,
        job_id=run_job_id(runtime),
        payload={**parsed.payload, "objectiveId": runtime},
    )
    # The caller's `traceparent` is the parent of the run job's trace.
    with caller_span("receipt.enqueue", request.headers, **{"receipt.agent_id": "factory"}) as tp:
        traced = dataclasses.replace(enqueue_request, trace_id=trace_id_of(tp), traceparent=tp)
        caps = org_caps(state.settings, parsed.organization_id) if parsed.organization_id else None
        result = await enqueue(state.require_store(), traced, caps)
        if result.idempotency_mismatch and spec.objective_id is None and idempotency_key:
            # As a schedule's or a webhook's other body under its key: not the one it made.
            raise ApiError(
                409,
                "conflict",
                "this Idempotency-Key made another objective",
                field="Idempotency-Key",
            )
        job = result.job
        # An enqueue request as a post of a job is: a re-post is counted `existing`.
        metric_counts.job_enqueued(
            job.lane, job.kind, job.agent_id, result.outcome, result.idempotency_mismatch
        )
        log.info(
            "objective requested",
            extra={
                "event": "api.objective_requested",
                "objectiveId": runtime,
                "outcome": result.outcome,
            },
        )
    shown = runtime if caller.admin else objective_id
    run_job = shown_id(caller, result.job)
    return JSONResponse(
        {
            "objectiveId": shown,
            "outcome": result.outcome,
            "job": job_view(result.job, None if caller.admin else run_job),
            "jobUrl": job_path(request, run_job),
            **_paths(request, shown),
        },
        status_code=202,
    )


@router.api_route(
    "/objectives",
    methods=["OPTIONS", "PUT", "PATCH", "DELETE", "TRACE"],
    include_in_schema=False,
)
async def objectives_other_methods() -> None:
    """Two routes share `/objectives`: a 405 must name both methods (Starlette names only the
    first route's)."""
    raise ApiError(405, "method_not_allowed", "Method Not Allowed", headers={"Allow": "GET, POST"})


def _summary(objective: ObjectiveSummary) -> dict[str, Any]:
    return {
        "objectiveId": objective.objective_id,
        "organizationId": objective.organization_id,
        "title": objective.title,
        "status": objective.status,
        "phase": objective.phase,
        "tasks": objective.tasks,
        "completedTasks": objective.completed_tasks,
        "error": objective.error,
        "createdAt": objective.created_at.isoformat(),
        "updatedAt": objective.updated_at.isoformat(),
    }


@router.get(
    "/objectives",
    response_model=ObjectiveList,
    responses=errors_documented(401, 403, 422, 503),
    dependencies=[_takes_query("status", "organizationId", "limit", "cursor")],
)
async def list_objectives(
    state: State,
    caller: Caller,
    status: Annotated[str | None, Query(json_schema_extra={"enum": list(STATUSES)})] = None,
    organization_id: Annotated[str | None, Query(alias="organizationId", min_length=1)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(min_length=1, max_length=1000)] = None,
) -> JSONResponse:
    """The caller's objectives, newest first, one page at a time (keyset cursor)."""
    require_scope(caller, JOBS_READ)
    page = await objectives.objectives_page(
        state.require_store(),
        caller,
        organization_id=organization_id,
        status=choice(status, "status", STATUSES),
        after=decode_cursor(cursor),
        limit=limit,
    )
    last = page.items[-1] if page.more else None
    return JSONResponse(
        {
            "objectives": [shown_view(caller, _summary(o)) for o in page.items],
            "nextCursor": encode_cursor(last.created_at, last.objective_id) if last else None,
        }
    )


async def objective_view(store: Store, objective: ObjectiveState) -> dict[str, Any]:
    """The folded objective with each task's current job status."""
    view = objective.to_json()
    # Its trace is its jobs' (`traceId` on each), not a field of this view.
    view.pop("traceparent", None)
    statuses = await objectives.job_statuses(store, [t.job_id for t in objective.tasks if t.job_id])
    for task in view["tasks"]:
        current = task["tries"][-1] if task["tries"] else None
        task["jobId"] = current["jobId"] if current else None
        task["attempt"] = len(task["tries"])
        task["jobStatus"] = statuses.get(current["jobId"]) if current else None
    view["stream"] = objective_stream(objective.objective_id)
    return view


@router.get(
    "/objectives/{objectiveId}",
    response_model=ObjectiveView,
    responses=errors_documented(401, 403, 404, 409, 422, 503),
    dependencies=[_takes_query()],
)
async def get_objective(state: State, caller: Caller, objective_id: ObjectiveId) -> JSONResponse:
    """The folded objective: phase, task graph, each task's status, tries and job."""
    objective = await _visible(state, caller, objective_id)
    return JSONResponse(shown_view(caller, await objective_view(state.require_store(), objective)))


def followed_objective(
    runtime_id: str,
    shown: str | None = None,
    caller: Principal | None = None,
    start: ObjectiveState | None = None,
) -> Followed[ObjectiveState]:
    """An objective's stream, ending once it is settled and audited (or settled with no audit
    to wait for: the audit is requested in the settling transaction). Its receipts are shown as
    `caller` sees them (an organization's ids without the tag), the objective as `shown`.
    `start` (its projection's row) is folded on from its seq, not from the stream's first."""

    def end(state: ObjectiveState) -> dict[str, Any] | None:
        if state.terminal and (state.audit is not None or state.audit_job_id is None):
            return {"objectiveId": shown or runtime_id, "status": state.status}
        return None

    def show(receipt: dict[str, Any]) -> dict[str, Any]:
        return shown_view(caller, receipt) if caller is not None else receipt

    return Followed(
        objective_stream(runtime_id),
        fold=objective_model.apply,
        end=end,
        show=show,
        start=start,
        start_seq=start.seq if start is not None else 0,
    )


@events_route(
    router,
    "/objectives/{objectiveId}/events",
    "It ends with `event: end` once settled and audited.",
    409,
    end=ObjectiveStreamEnd,
    response_model=ObjectiveEventsPage,
)
async def get_objective_events(
    asked: Asked, state: State, caller: Caller, objective_id: ObjectiveId
) -> Response:
    """The objective's receipts; with `Accept: text/event-stream`, live until it ends."""
    objective = await _visible(state, caller, objective_id)
    head = {"objectiveId": objective_id, "status": objective.status}
    followed = followed_objective(objective.objective_id, objective_id, caller, objective)
    return await events_response(asked, state, caller, followed, head)


@router.post(
    "/objectives/{objectiveId}/cancel",
    status_code=202,
    response_model=ObjectiveCancelAccepted,
    responses=errors_documented(400, 401, 403, 404, 409, 413, 415, 422, 429, 503),
    dependencies=[_takes_query()],
    openapi_extra=json_body_documented("ObjectiveCancelBody", required=False),
)
async def cancel_objective(
    request: Request, state: State, caller: Caller, objective_id: ObjectiveId
) -> JSONResponse:
    """Cancel: control aborts the objective's running jobs and settles it `canceled` (202);
    409 when it is already settled. Before its run job has created it, the run job is aborted
    (202: `canceled` when it was still waiting, else `active` until the cancel lands)."""
    require_scope(caller, JOBS_WRITE)
    if not caller.admin:  # an admin names runtime ids (`<id>~<tag>`)
        check_objective_id(objective_id)
    given = await read_optional_json_body(request, state.settings.max_body_bytes, state.json_limits)
    body = _object(given, CANCEL_FIELDS) if given is not None else {}
    reason = body.get("reason") or "canceled by request"
    if not isinstance(reason, str):
        raise InvalidInput("reason", "reason must be a string")
    if len(reason.encode()) > state.settings.max_command_bytes:
        raise InvalidInput(
            "reason",
            f"reason must be at most {state.settings.max_command_bytes} bytes "
            "(RECEIPT_MAX_COMMAND_BYTES)",
        )
    store = state.require_store()
    runtime = await _runtime(store, caller, objective_id)
    if (await objectives.get(store, runtime)) is None and (
        run := await _run_job(store, caller, runtime)
    ) is not None:
        # Not created yet: its run job is aborted (canceled at once while it waits, its
        # planner stopped while it runs); an objective it creates meanwhile is canceled by the
        # control pass its creation requests (receipts/objectives/control.py), and a creation
        # that committed before this abort is found below and canceled as any objective.
        if not run.terminal and not run.abort_requested:
            await ops.add_command(
                store, run.job_id, type="abort", reason=reason, check_organization=False
            )
        if (await objectives.get(store, runtime)) is None:
            aborted = await store.get_job(run.job_id)
            if aborted is not None and aborted.status in (
                "queued",
                "leased",
                "running",
                "canceled",
            ):
                log.info(
                    "objective cancel requested before it was created: its run job aborted",
                    extra={"event": "api.objective_cancel", "objectiveId": runtime},
                )
                status = "canceled" if aborted.status == "canceled" else "active"
                return JSONResponse(
                    {"objectiveId": objective_id, "status": status, "cancelRequested": True},
                    status_code=202,
                )
    objective = await _visible(state, caller, objective_id, reading=False)
    try:
        async with store.transaction() as tx:
            updated = await objectives.request_cancel(tx, objective.objective_id, reason)
    except objectives.ObjectiveTerminal as exc:
        # The caller's own id in the message, not the runtime's (`<id>~<tag>`).
        message = f"objective {objective_id!r} is {exc.state.status}"
        raise ApiError(409, "terminal_state", message) from exc
    assert updated is not None
    log.info(
        "objective cancel requested",
        extra={"event": "api.objective_cancel", "objectiveId": objective.objective_id},
    )
    return JSONResponse(
        {"objectiveId": objective_id, "status": updated.status, "cancelRequested": True},
        status_code=202,
    )
