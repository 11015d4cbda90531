"""A job's commands: steer, follow_up and abort, appended to its stream (README, "HTTP API").

A steer or follow_up is handed to the job's handler when its kind reads one; an abort stops any
job. With an `Idempotency-Key` a command is named by the key, so a post sent again after its
answer was lost appends nothing a second time (docs/rules.md X23).
"""

from __future__ import annotations

import logging
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from receipts import metrics, operations
from receipts.agent_jobs import interventions
from receipts.commands import with_payloads
from receipts.errors import InvalidInput, TransientStorageError
from receipts.jobs import Job
from receipts.kinds import runs_commands, unread_because
from receipts.streams import same_json
from roles.api.auth import COMMANDS_RUN, JOBS_WRITE
from roles.api.body import IdempotencyKey, keyed_id, read_json_body, validated
from roles.api.deps import (
    ApiError,
    ApiState,
    Caller,
    JobId,
    State,
    require_scope,
    shown_id,
    takes_query,
    visible_job,
)
from roles.api.limits import command_cap_refused, follow_up_cap_refused
from roles.api.schema import (
    CommandAccepted,
    CommandBody,
    errors_documented,
    job_view,
    json_body_documented,
)
from roles.api.sse import json_size

log = logging.getLogger("roles.api.app")

COMMAND_CONFLICT_RETRIES = 3

router = APIRouter(tags=["jobs"])


@router.post(
    "/jobs/{jobId:path}/commands",
    status_code=202,
    response_model=CommandAccepted,
    responses=errors_documented(400, 401, 403, 404, 409, 413, 415, 422, 429, 503),
    openapi_extra=json_body_documented("CommandBody"),
    dependencies=[takes_query()],
)
async def post_command(
    request: Request,
    state: State,
    caller: Caller,
    job_id: JobId,
    idempotency_key: IdempotencyKey = None,
) -> JSONResponse:
    """Append a steer, follow_up or abort command; 409 when the job is already terminal.

    A steer or follow_up is at most `RECEIPT_MAX_COMMAND_BYTES`, takes one of the
    organization's enqueue tokens (429 `RECEIPT_ORG_ENQUEUE_RATE`) and a job takes at most
    `RECEIPT_MAX_COMMANDS_PER_JOB` of them (422 beyond), an agent job's follow-ups for its next
    turn at most `RECEIPT_AGENT_JOB_MAX_FOLLOW_UP_BYTES` together (422); an abort is always
    taken and stops any job (a job that holds one answers it again, nothing written). Which kinds read steer
    and follow_up: `factory.objective.control` both (as control requests);
    `factory.task.run` and `factory.integration.*` steers, one JSON line each on the
    command's stdin, when the task sets `steerable: true`; an agent job's turn steers (on
    stdin) and follow-ups (its next turn); no other kind. `readByHandler` says
    whether this job's handler reads this one; a command the job ends without reading is
    settled by a `queue.command.unconsumed` receipt naming why, just before its terminal one.
    With an `Idempotency-Key` the command is named by the key: sent again, the job's command of
    that id is answered as it stands (also once an abort ended the job), nothing appended;
    another command under the key (another type, payload or reason) is 409 `conflict`.
    """
    require_scope(caller, JOBS_WRITE)
    settings = state.settings
    body = validated(
        CommandBody,
        await read_json_body(request, settings.max_body_bytes, state.json_limits),
    )
    size = json_size(body.payload) + len(body.reason or "")
    if size > settings.max_command_bytes:
        metrics.API_LIMITED.labels("command_bytes").inc()
        raise InvalidInput(
            "payload",
            f"a command's payload and reason hold at most {settings.max_command_bytes} bytes "
            "(RECEIPT_MAX_COMMAND_BYTES)",
        )
    if body.type != "abort":  # a steer takes a token, as one posted as an enqueue does
        await state.org_limits.admit_paced(caller.organization_id)
    target = await visible_job(state, caller, job_id)
    if body.type != "abort" and runs_commands(target.agent_id, target.kind):
        require_scope(caller, COMMANDS_RUN)
    internal_id = target.job_id
    # The key names a command of this job only (two jobs steered under one key hold two).
    keyed = keyed_id(f"{internal_id}\x00{idempotency_key}") if idempotency_key else None
    command_id = f"cmd-{keyed or uuid.uuid4()}"
    for _ in range(COMMAND_CONFLICT_RETRIES):
        outcome = await interventions.add_command(
            state.require_store(),
            internal_id,
            type=body.type,
            payload=body.payload,
            reason=body.reason,
            organization_id=caller.organization_id,
            check_organization=not caller.admin,
            command_id=command_id,
            max_commands=settings.max_commands_per_job,
            max_follow_up_bytes=settings.agent_job_max_follow_up_bytes,
        )
        if outcome.status != operations.SETTLEMENT_CONFLICT:
            break
    if outcome.status == operations.NOT_FOUND:
        raise ApiError(404, "not_found", f"no job {job_id!r}", field="jobId")
    if outcome.status == operations.COMMAND_ID_TAKEN:
        raise _key_taken(job_id)
    if outcome.status == operations.TERMINAL_STATE:
        status = outcome.job.status if outcome.job else "terminal"
        raise ApiError(
            409, "terminal_state", f"job {job_id!r} is {status}; it takes no more commands"
        )
    if outcome.status == operations.AGENT_JOB_NOT_RUNNING:
        raise ApiError(
            409,
            "agent_job_not_running",
            f"job {job_id!r} is a turn of an agent job that no longer runs on it (stopped, or "
            "moved on to another turn); it takes no steer or follow-up",
        )
    if outcome.status == operations.TOO_MANY_COMMANDS:
        command_cap_refused(caller.organization_id, internal_id)
        raise InvalidInput(
            "type",
            f"job {job_id!r} already holds {settings.max_commands_per_job} commands "
            "(RECEIPT_MAX_COMMANDS_PER_JOB); only an abort is taken",
        )
    if outcome.status == interventions.FOLLOW_UPS_FULL:
        follow_up_cap_refused(caller.organization_id, internal_id)
        raise InvalidInput(
            "payload",
            f"job {job_id!r} is a turn of an agent job that holds at most "
            f"{settings.agent_job_max_follow_up_bytes} bytes of follow-ups for its next turn "
            "(RECEIPT_AGENT_JOB_MAX_FOLLOW_UP_BYTES: those it carries from turns that did not "
            "end their work and those sent to this turn); this one would pass it",
        )
    if not outcome.ok or outcome.job is None:
        raise TransientStorageError(f"command not appended: {outcome.status}")
    held = {c.command_id for c in outcome.job.commands}
    if keyed and outcome.already and command_id in held:
        await same_command(state, outcome.job, command_id, body, job_id)
    if outcome.already and command_id not in held:  # the job's abort, asked again: it answers
        aborts = (c.command_id for c in outcome.job.commands if c.type == "abort")
        command_id = next(aborts, command_id)
    log.info(
        "command appended",
        extra={
            "event": "api.command",
            "jobId": internal_id,
            "type": body.type,
            "existing": outcome.already,
        },
    )
    return JSONResponse(
        {
            "commandId": command_id,
            "jobId": job_id,
            "type": body.type,
            "readByHandler": unread_because(target.agent_id, target.kind, target.payload, body.type)
            is None,
            "job": job_view(outcome.job, shown_id(caller, outcome.job)),
        },
        status_code=202,
    )


async def same_command(
    state: ApiState, job: Job, command_id: str, body: CommandBody, job_id: str
) -> None:
    """409 `conflict` when the command a key names is not this post's: its payload or reason
    differ (its type the decision compared). A post sent again is the same post; another one
    under a used key was answered with the first and dropped unseen."""
    given = next(c for c in job.commands if c.command_id == command_id)
    (stored,) = await with_payloads(state.require_store(), job.job_id, [given])
    if not same_json(stored.payload, body.payload) or given.reason != body.reason:
        raise _key_taken(job_id)


def _key_taken(job_id: str) -> ApiError:
    """409: the job holds another command under the post's Idempotency-Key."""
    return ApiError(
        409,
        "conflict",
        f"job {job_id!r} holds another command under this Idempotency-Key",
        field="Idempotency-Key",
    )
