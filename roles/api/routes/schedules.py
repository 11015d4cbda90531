"""Schedule routes: create, list, show, change (pause, resume, redefine) and delete the recurring
jobs of an organization. Each firing enqueues `<scheduleId>:<fire time>` through the ordinary
enqueue path (receipts/schedules/store.py); worker-control keeps a Temporal Schedule per schedule
(roles/delivery/schedules.py).

Tenant rules are the jobs': a caller sees and changes only its organization's schedules
(another organization's is 404); admin sees all. Creating or changing one needs `jobs:write`,
and `commands:run` when its job runs commands, as enqueueing that job would.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse, Response

from receipts.enqueue import EnqueueRequest
from receipts.errors import ConflictError, InvalidInput
from receipts.jobs import Job
from receipts.kinds import KINDS_WITHOUT_AUTH, redact_payload
from receipts.objectives import store as objectives
from receipts.schedules import cron
from receipts.schedules import store as schedules
from receipts.schedules.model import ScheduleState, definition_data, schedule_stream
from receipts.store import Store
from receipts.tenancy import TENANT_SEPARATOR, scoped_id
from roles.api.admission import check_agent, check_command_rights, check_gateway
from roles.api.auth import COMMANDS_RUN, JOBS_READ, JOBS_WRITE, Principal
from roles.api.body import (
    IdempotencyKey,
    decode_cursor,
    encode_cursor,
    keyed_id,
    read_json_body,
    validated,
)
from roles.api.deps import ApiError, ApiState, Caller, State, require_scope, shown_view
from roles.api.deps import takes_query as _takes_query
from roles.api.documented import ScheduleBody, SchedulePatchBody
from roles.api.schema import ScheduleList, ScheduleView, errors_documented, json_body_documented
from roles.api.sse import last_shown, within_budget

router = APIRouter(tags=["schedules"])
ScheduleId = Annotated[str, Path(alias="scheduleId", description="The schedule id")]


def _limits(state: ApiState) -> schedules.Limits:
    settings = state.settings
    return schedules.Limits(
        min_interval_s=settings.schedule_min_interval_s,
        max_per_organization=settings.org_max_schedules,
    )


def admitted(
    state: ApiState, caller: Principal, fields: dict[str, Any]
) -> tuple[schedules.Definition, EnqueueRequest]:
    """The definition, validated as its firings' enqueues would be (agent, rights, gateway)."""
    definition, request = schedules.validate(
        fields, caller.organization_id, _limits(state), admin=caller.admin
    )
    check_agent(state.settings, definition.agent_id)
    if request.kind in KINDS_WITHOUT_AUTH and not caller.admin:
        # As a post of it: the watchdog scans every organization's objectives.
        raise ApiError(
            403,
            "forbidden",
            f"{request.kind} is the runtime's own kind: only an admin token may schedule it",
            field="job.payload.kind",
        )
    check_command_rights(caller, state.settings, definition.agent_id, request)
    if request.singleton_mode == "steer" and not caller.can(COMMANDS_RUN):
        # Each firing's steer lands in the session's active job, which may run commands: as a
        # steer posted directly, it needs the right to run them.
        raise ApiError(
            403,
            "forbidden",
            "a schedule of steers may steer a job that runs commands: it needs commands:run",
            field="job.singletonMode",
        )
    check_gateway(state.settings, request)
    return definition, request


PATCH_TRIES = 3


def current_fields(schedule: ScheduleState) -> dict[str, Any]:
    """The schedule's definition as a create's body would give it (what a change starts from)."""
    current = definition_data(schedule)
    return {
        "cron": current["cron"],
        "interval": f"{current['intervalS']}s" if current["intervalS"] else None,
        "timezone": current["timezone"],
        "agentId": current["agentId"],
        "job": current["job"],
        "overlap": current["overlap"],
    }


async def _visible(state: ApiState, caller: Principal, schedule_id: str) -> ScheduleState:
    """The schedule the caller names `schedule_id` (an organization names its own; an admin
    names runtime ids, or an organization's own id while one organization has it: 409
    `ambiguous_schedule_id` when several do); 404 for one it may not see or that was deleted."""
    require_scope(caller, JOBS_READ)
    store = state.require_store()
    runtime = schedule_id if caller.admin else scoped_id(caller.organization_id, schedule_id)
    schedule = await schedules.get(store, runtime)
    # A deleted schedule of that id (the runtime's own, unscoped) is no name either.
    gone = schedule is None or schedule.terminal
    if gone and caller.admin and TENANT_SEPARATOR not in schedule_id:
        named = await schedules.named(store, schedule_id)
        if len(named) > 1:
            raise ApiError(
                409,
                "ambiguous_schedule_id",
                f"several organizations have a schedule {schedule_id!r}: name it by its "
                "runtime id (<id>~<tag>)",
                field="scheduleId",
            )
        schedule = await schedules.get(store, named[0]) if named else None
    if schedule is None or schedule.terminal or not caller.sees(schedule.organization_id):
        raise ApiError(404, "not_found", f"no schedule {schedule_id!r}", field="scheduleId")
    return schedule


async def schedule_view(store: Store, schedule: ScheduleState) -> dict[str, Any]:
    """The schedule with its next fire times and its last firings' job statuses."""
    return (await schedule_views(store, [schedule]))[0]


async def schedule_views(store: Store, page: Sequence[ScheduleState]) -> list[dict[str, Any]]:
    """`schedule_view` of each schedule of a page, their firings' jobs read in one query."""
    jobs = await objectives.jobs_by_ids(
        store, [f.job_id for schedule in page for f in schedule.recent if f.job_id]
    )
    return [_view(schedule, jobs) for schedule in page]


def _view(schedule: ScheduleState, jobs: Mapping[str, Job]) -> dict[str, Any]:
    view = schedule.to_json()
    job = view.get("job")
    if isinstance(job, dict) and "payload" in job:
        # The firings' `task.env` values may be secrets: names only, as every read of a job.
        view["job"] = {**job, "payload": redact_payload(job["payload"])}
    view["nextFireTimes"] = (
        [
            t.isoformat()
            for t in cron.next_times(
                cron=schedule.cron,
                interval_s=schedule.interval_s,
                timezone=schedule.timezone,
                after=datetime.now(UTC),
                count=schedules.NEXT_FIRE_TIMES,
            )
        ]
        if schedule.status == "active"
        else []
    )
    runs = []
    for firing in view["recent"]:
        job = jobs.get(firing["jobId"]) if firing.get("jobId") else None
        runs.append({**firing, "jobStatus": job.status if job else None})
    view["lastRuns"] = runs
    view["stream"] = schedule_stream(schedule.schedule_id)
    return view


def _keyed(idempotency_key: str | None) -> str | None:
    keyed = keyed_id(idempotency_key)
    return f"sch-{keyed}" if keyed else None


@router.post(
    "/schedules",
    status_code=201,
    response_model=ScheduleView,
    responses={
        200: {"model": ScheduleView, "description": "The same definition, posted before"},
        **errors_documented(400, 401, 403, 404, 409, 413, 415, 422, 429, 503),
    },
    dependencies=[_takes_query()],
    openapi_extra=json_body_documented("ScheduleBody"),
)
async def post_schedule(
    request: Request, state: State, caller: Caller, idempotency_key: IdempotencyKey = None
) -> JSONResponse:
    """Create a schedule (201); a re-post of the same definition under its id answers 200 with
    it, another definition 409. A body without `scheduleId` sent with an `Idempotency-Key` names
    the schedule by the key (`sch-<uuid>`), so it is sent again as safely. A cron expression,
    interval or time zone that cannot be used is refused (422 naming the field and why), as is
    a job its firings could not enqueue."""
    require_scope(caller, JOBS_WRITE)
    body = await read_json_body(request, state.settings.max_body_bytes, state.json_limits)
    spec = validated(ScheduleBody, body)
    definition, enqueue = admitted(state, caller, body)
    # An organization's token makes its own (validated: the job's authContext is its); an
    # admin's belongs to the job's organization, none for the runtime's own kind (which may
    # send `authContext: null`).
    organization = caller.organization_id or enqueue.organization_id
    # Each change is work for the schedule sync, as a job is for the workers: it takes one of
    # the organization's enqueue tokens (429), or one tenant's create-delete churn holds every
    # other organization's schedules back from Temporal.
    await state.org_limits.admit_paced(organization)
    try:
        schedule, created = await schedules.create(
            state.require_store(),
            organization,
            spec.schedule_id or _keyed(idempotency_key) or f"sch-{uuid.uuid4().hex[:12]}",
            definition,
            _limits(state),
            paused=spec.paused,
        )
    except schedules.LimitReached as exc:
        # Waiting does not free a place (a deletion does): 409, as the webhook cap answers.
        raise ApiError(409, "too_many_schedules", str(exc)) from None
    except ConflictError as exc:
        named = "scheduleId" if spec.schedule_id or not idempotency_key else "Idempotency-Key"
        raise ApiError(409, "conflict", str(exc), field=named) from None
    view = shown_view(caller, await schedule_view(state.require_store(), schedule))
    return JSONResponse(view, status_code=201 if created else 200)


@router.get(
    "/schedules",
    response_model=ScheduleList,
    responses=errors_documented(401, 403, 422, 503),
    dependencies=[_takes_query("limit", "cursor")],
)
async def list_schedules(
    state: State,
    caller: Caller,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(min_length=1, max_length=1000)] = None,
) -> JSONResponse:
    """The caller's schedules, newest first, one page at a time (keyset cursor)."""
    require_scope(caller, JOBS_READ)
    store = state.require_store()
    page = await schedules.schedules_page(store, caller, after=decode_cursor(cursor), limit=limit)
    views = within_budget(
        [shown_view(caller, view) for view in await schedule_views(store, page.items)],
        state.settings.max_response_bytes,
    )
    last = last_shown(page.items, len(views), page.more)
    return JSONResponse(
        {
            "schedules": views,
            "nextCursor": encode_cursor(last.created_at, last.schedule_id) if last else None,
        }
    )


@router.get(
    "/schedules/{scheduleId}",
    response_model=ScheduleView,
    responses=errors_documented(401, 403, 404, 409, 422, 503),
    dependencies=[_takes_query()],
)
async def get_schedule(state: State, caller: Caller, schedule_id: ScheduleId) -> JSONResponse:
    """The schedule: definition, status, next fire times, last firings and their jobs."""
    schedule = await _visible(state, caller, schedule_id)
    return JSONResponse(shown_view(caller, await schedule_view(state.require_store(), schedule)))


@router.patch(
    "/schedules/{scheduleId}",
    response_model=ScheduleView,
    responses=errors_documented(400, 401, 403, 404, 409, 413, 415, 422, 429, 503),
    dependencies=[_takes_query()],
    openapi_extra=json_body_documented("SchedulePatchBody"),
)
async def patch_schedule(
    request: Request, state: State, caller: Caller, schedule_id: ScheduleId
) -> JSONResponse:
    """Pause (`paused: true`, with an optional `note`; a paused one's note is replaced), resume
    (`paused: false`) or change it; only what differs is recorded. A changed definition is
    validated as at create."""
    require_scope(caller, JOBS_WRITE)
    body = await read_json_body(request, state.settings.max_body_bytes, state.json_limits)
    patch = validated(SchedulePatchBody, body)
    if patch.note is not None and patch.paused is not True:
        # A note says why a schedule is paused; alone it would change nothing and answer 200.
        raise InvalidInput("note", "note goes with paused: true (it says why it is paused)")
    changing = {k: v for k, v in body.items() if k not in ("paused", "note")}
    for tries_left in reversed(range(PATCH_TRIES)):
        # The fields are merged onto the schedule as read; a change landing in between makes
        # the write refuse, and the merge is made again on the schedule as it is then.
        schedule = await _visible(state, caller, schedule_id)
        if tries_left == PATCH_TRIES - 1:  # the change takes one token, however many reads
            await state.org_limits.admit_paced(schedule.organization_id)
        definition = None
        fields = current_fields(schedule)
        if changing:
            if "cron" in changing:
                fields["interval"] = None
            if "interval" in changing:
                fields["cron"] = None
            fields.update(changing)
            definition, _ = admitted(state, caller, fields)
        elif patch.paused is False and schedule.status == "paused":
            # A resume starts firings again: the caller must hold what enqueueing them needs.
            admitted(state, caller, fields)
        try:
            changed = await schedules.change(
                state.require_store(),
                schedule.schedule_id,
                definition=definition,
                paused=patch.paused,
                note=patch.note,
                based_on=schedule.definition_seq,
            )
            break
        except schedules.DefinitionMoved as exc:
            if not tries_left:
                raise ApiError(
                    409,
                    "conflict",
                    "the schedule kept changing while this change was made; send it again",
                    field="scheduleId",
                ) from exc
    if changed is None:
        raise ApiError(404, "not_found", f"no schedule {schedule_id!r}", field="scheduleId")
    return JSONResponse(shown_view(caller, await schedule_view(state.require_store(), changed)))


@router.delete(
    "/schedules/{scheduleId}",
    status_code=204,
    responses=errors_documented(401, 403, 404, 409, 422, 429, 503),
    dependencies=[_takes_query()],
)
async def delete_schedule(state: State, caller: Caller, schedule_id: ScheduleId) -> Response:
    """Delete the schedule (204): it fires no more; the jobs it enqueued are left as they are.
    Its id is not reused."""
    require_scope(caller, JOBS_WRITE)
    schedule = await _visible(state, caller, schedule_id)
    await state.org_limits.admit_paced(schedule.organization_id)
    deleted = await schedules.change(state.require_store(), schedule.schedule_id, delete=True)
    if deleted is None:
        raise ApiError(404, "not_found", f"no schedule {schedule_id!r}", field="scheduleId")
    return Response(status_code=204)
