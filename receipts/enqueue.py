"""Enqueue: validate a request, then in one transaction apply idempotency, singleton mode and append."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel

from receipts import jobs as jobmodel
from receipts.commands import with_payloads
from receipts.errors import ConflictError, InvalidInput, NotPermitted
from receipts.job_append import JobAppend, insert_params, plan
from receipts.jobs import (
    DEFAULT_LANE,
    DEFAULT_MAX_ATTEMPTS,
    LANES,
    MAX_ATTEMPTS,
    MIN_ATTEMPTS,
    SINGLETON_CANCEL_REASON,
    SINGLETON_MODES,
    Job,
)
from receipts.kinds import (
    CONTRACTS,
    MAX_ID_LENGTH,
    NON_BLANK,
    EnqueuePayload,
    invalid_input,
    runs_commands,
    scoped_payload,
)
from receipts.store import Draft, Store, Tx
from receipts.text import check_clean_text
from receipts.trace_context import trace_id_of

log = logging.getLogger("receipts.enqueue")

MAX_DELAY_MS = 7 * 24 * 3600 * 1000

NEW_JOB_TRIES = 3
"""Reads and statements a new job's write makes while its caps move in between, before it
takes the locked path (`enqueue_new`; receipts/enqueue_batch.py likewise for a batch)."""


@dataclass(frozen=True, slots=True)
class EnqueueRequest:
    """A validated enqueue: everything `enqueue` needs, already checked."""

    agent_id: str
    payload: dict[str, Any]
    kind: str
    organization_id: str | None
    job_id: str | None = None
    lane: str = DEFAULT_LANE
    session_key: str | None = None
    singleton_mode: str = "allow"
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    delay_ms: int = 0
    trace_id: str | None = None
    traceparent: str | None = None
    retry_of: str | None = None
    max_commands: int | None = None
    """A steer singleton absorbed into a job holding this many commands is refused (the API's
    `RECEIPT_MAX_COMMANDS_PER_JOB`); None: no cap."""
    max_command_bytes: int | None = None
    """A steer singleton whose payload serialises to more is refused when it would be absorbed."""
    new_job_id: bool = False
    """`job_id` was made up for this request (a random uuid: the caller named no job), so no job
    or absorbed steer can hold it yet: `enqueue` skips the jobId lock and lookup."""
    may_steer_commands: bool = True
    """A steer singleton may be absorbed into a job that runs commands (the API's caller holds
    `commands:run`); False: such an absorption is refused (`NotPermitted`)."""
    objective_id_assigned: bool = False
    """`payload.objectiveId` was assigned here (a `factory.run` that named none): a re-post of
    the same body is the same request whatever id its job was given."""


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    """What enqueue did: the job to return and whether a new one was written.

    `outcome` is `created`, `existing` (idempotent re-post) or `steered` (a `steer` singleton
    absorbed the request into an active job); `affected` lists the other jobs the singleton mode
    touched (canceled or sent an abort).
    """

    job: Job
    outcome: str
    affected: tuple[Job, ...] = ()
    idempotency_mismatch: bool = False
    """A re-post named an existing job (or absorbed steer) with another agent or payload: the
    existing one is returned unchanged, as for any re-post, and the caller is told."""

    @property
    def created(self) -> bool:
        """True when a new job was appended."""
        return self.outcome == "created"


async def _same_request(tx: Tx, existing: Job, request: EnqueueRequest, job_id: str) -> bool:
    """True when a re-post asks for what the existing job (or absorbed steer) already is. The
    steer's payload is read from its receipt (the job's state keeps a reference)."""
    if existing.job_id == job_id:
        payload = request.payload
        if request.objective_id_assigned and "objectiveId" in existing.payload:
            payload = {**payload, "objectiveId": existing.payload["objectiveId"]}
        return existing.agent_id == request.agent_id and existing.payload == payload
    command = next((c for c in existing.commands if c.command_id == job_id), None)
    if command is None:
        return True
    [read] = await with_payloads(tx, existing.job_id, [command])
    return bool(read.payload == request.payload)


# Temporal workflow ids are derived from job ids (`<jobId>:gen:<g>`, `<jobId>:attempt:<n>`), and
# stream names from `jobs/<jobId>`; a job id that looks like one of those is refused.
RESERVED_ID_PARTS: tuple[str, ...] = (":gen:", ":attempt:", ":redrive:", "/")
RESERVED_ID_PREFIX = "watchdog:"
# The jobs of an objective are named after it (`objective:<id>:…`, receipts/objectives/model.py)
# by the runtime alone: a caller who could choose such an id could be first to a job the
# runtime is about to create (a re-post is answered with the existing job).
OBJECTIVE_JOB_PREFIX = "objective:"


def _one_of(name: str, allowed: tuple[str, ...], required: bool = False) -> Any:
    """A before-validator: `value` is one of `allowed` (or None unless `required`), else 422
    naming them."""

    def check(value: Any) -> Any:
        if (value is not None or required) and (not isinstance(value, str) or value not in allowed):
            raise InvalidInput(
                name, f"{name} must be one of: {', '.join(allowed)} (got {value!r})", allowed
            )
        return value

    return BeforeValidator(check)


def choice_field(name: str, allowed: tuple[str, ...], *, required: bool = False) -> Any:
    """A string field holding one of `allowed` (422 naming them), documented as an enum."""
    return Annotated[
        str if required else str | None,
        _one_of(name, allowed, required),
        WithJsonSchema({"type": "string", "enum": list(allowed)}),
    ]


if TYPE_CHECKING:
    LaneField = str | None
    SingletonModeField = str | None
else:
    LaneField = choice_field("lane", LANES)
    SingletonModeField = choice_field("singletonMode", SINGLETON_MODES)

JOB_ID_PATTERN = r"^[A-Za-z0-9._:@-]{1,200}$"
"""Job ids a caller may choose (a newline in an id made the job unreachable)."""


class EnqueueBody(BaseModel):
    """An enqueue request. Unknown top-level fields are refused (422).

    The same model validates the HTTP body and documents it (the API's OpenAPI schema).
    """

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=False, extra="forbid", frozen=True
    )

    job_id: str | None = Field(
        default=None,
        pattern=JOB_ID_PATTERN,
        description="Idempotency key of the job, scoped to the caller's organization",
    )
    lane: LaneField = None
    session_key: str | None = Field(default=None, max_length=MAX_ID_LENGTH, pattern=NON_BLANK)
    singleton_mode: SingletonModeField = None
    max_attempts: StrictInt | None = Field(
        default=None,
        description=f"clamped to {MIN_ATTEMPTS}..{MAX_ATTEMPTS}; default {DEFAULT_MAX_ATTEMPTS}",
    )
    delay_ms: StrictInt | None = Field(default=None, ge=0, le=MAX_DELAY_MS)
    payload: EnqueuePayload


ENQUEUE_FIELDS: tuple[str, ...] = tuple(
    f.alias or name for name, f in EnqueueBody.model_fields.items()
)


def _check_job_id(job_id: str | None, kind: str, *, system: bool) -> None:
    if job_id is None:
        return
    for part in RESERVED_ID_PARTS:
        if part in job_id:
            raise InvalidInput(
                "jobId",
                f"jobId must not contain {part!r} (reserved for delivery ids and stream names)",
            )
    if job_id.startswith(RESERVED_ID_PREFIX) and not (
        system and kind == "factory.objective.watchdog"
    ):
        raise InvalidInput(
            "jobId", f"jobId prefix {RESERVED_ID_PREFIX!r} is reserved for the objective watchdog"
        )
    if job_id.startswith(OBJECTIVE_JOB_PREFIX):
        raise InvalidInput(
            "jobId",
            f"jobId prefix {OBJECTIVE_JOB_PREFIX!r} is reserved for the jobs of objectives",
        )


def clamp_attempts(value: int) -> int:
    """Clamp `maxAttempts` to the spec's range 1..8."""
    return max(MIN_ATTEMPTS, min(MAX_ATTEMPTS, value))


def parse_enqueue(
    agent_id: str,
    body: Mapping[str, Any],
    *,
    system: bool = False,
    text_checked: bool = False,
) -> EnqueueRequest:
    """Validate an enqueue body for `agent_id`; raise `InvalidInput` naming the field at fault.

    `system` is the runtime's own enqueue (the watchdog tick): its `watchdog:<time>` ids are
    the only ones outside `JOB_ID_PATTERN`. `text_checked` says the caller already refused NUL
    and lone surrogates in the whole body (the API does it once, when it reads the body).
    """
    if not isinstance(agent_id, str) or not agent_id.strip() or len(agent_id) > MAX_ID_LENGTH:
        raise InvalidInput(
            "agentId", f"agentId must be a non-empty string of at most {MAX_ID_LENGTH} characters"
        )
    if not isinstance(body, Mapping):
        raise InvalidInput("body", "the request body must be a JSON object")
    if not text_checked:
        check_clean_text(body, "")
    check_clean_text(agent_id, "agentId")
    job_id = body.get("jobId")
    if system and isinstance(job_id, str) and job_id.startswith(RESERVED_ID_PREFIX):
        body = {k: v for k, v in body.items() if k != "jobId"}
    else:
        job_id = None
    try:
        parsed = EnqueueBody.model_validate(body)
    except ValidationError as exc:
        error = invalid_input(exc)
        if error.message.startswith("unknown field") and "." not in error.field:
            error.allowed = list(ENQUEUE_FIELDS)
        if error.field == "jobId":
            error.message = "jobId must be 1 to 200 characters of letters, digits and . _ : @ -"
        raise error from None
    job_id = job_id if job_id is not None else parsed.job_id
    kind = parsed.payload.kind
    auth = parsed.payload.auth_context
    _check_job_id(job_id, kind, system=system)
    max_attempts = parsed.max_attempts
    # The contract's objective scoping: a kind that acts on an objective names it (422 without).
    payload = scoped_payload(kind, body["payload"], CONTRACTS[kind])
    assigned = "objectiveId" in payload and "objectiveId" not in body["payload"]
    return EnqueueRequest(
        agent_id=agent_id,
        payload=payload,
        kind=kind,
        organization_id=auth.organization_id if auth is not None else None,
        job_id=job_id,
        lane=parsed.lane or DEFAULT_LANE,
        session_key=parsed.session_key,
        singleton_mode=parsed.singleton_mode or "allow",
        max_attempts=clamp_attempts(DEFAULT_MAX_ATTEMPTS if max_attempts is None else max_attempts),
        delay_ms=parsed.delay_ms or 0,
        objective_id_assigned=assigned,
    )


def session_lock_key(organization_id: str | None, session_key: str) -> str:
    """Return the advisory-lock key of a session key, scoped by organization."""
    return f"session:{organization_id or ''}:{session_key}"


def job_lock_key(job_id: str) -> str:
    """Return the advisory-lock key that serialises enqueues naming one jobId."""
    return f"job:{job_id}"


@dataclass(frozen=True, slots=True)
class Admission:
    """The per-organization caps an enqueue must fit (the API's): `refuse(queued, active)`
    raises when the organization's open jobs do not leave room for one more."""

    organization_id: str
    max_queued: int
    max_active: int
    refuse: Callable[[int, int], None]


async def enqueue(
    store: Store, request: EnqueueRequest, admission: Admission | None = None
) -> EnqueueResult:
    """Enqueue in one transaction, in docs/design.md §4's order.

    1. jobId lookup (unless the id is `new_job_id`): an existing job (or the job a steer with
       this id was absorbed into) is returned unchanged, as the specification says, even when
       it was enqueued with another agent or payload (`idempotency_mismatch` says so); one
       owned by another organization raises `ConflictError`.
    2. the session-key lock; 3. expiry of stale leases on the session key; 4. the singleton
    scan; 5. append `job.enqueued`.

    `admission`, when given, is checked before a job is created (the API's per-organization
    caps), after the lookup and the steer, which create none; what it raises leaves nothing
    written. A job with a new id and no session key has no lookup, lock or scan
    to make: it is written by `enqueue_new`, without a transaction.
    """
    if request.new_job_id and request.session_key is None and request.job_id is not None:
        return await enqueue_new(store, request, admission)
    return await _enqueue_locked(store, request, admission)


async def _enqueue_locked(
    store: Store, request: EnqueueRequest, admission: Admission | None
) -> EnqueueResult:
    async with store.transaction() as tx:
        return await enqueue_in(tx, request, admission)


async def enqueue_new(
    store: Store, request: EnqueueRequest, admission: Admission | None = None
) -> EnqueueResult:
    """A job with a new id and no session key, in two round trips and no transaction: one read
    (the database clock and, with `admission`, the organization's open jobs), then one statement
    that writes `job.enqueued` and the projection row only if the caps still hold at its own
    time (receipts/sql/api.sql `enqueue_new`); else nothing was written, and it reads again."""
    assert request.job_id is not None
    organization_id = admission.organization_id if admission else None
    async with store.session() as session:  # one checkout for the read and the write
        for _ in range(NEW_JOB_TRIES):
            row = await session.fetch_one("enqueue_caps", {"organization_id": organization_id})
            assert row is not None
            now = row[0]
            if admission is not None:
                admission.refuse(int(row[1]), int(row[2]))
            planned = plan_new(store, request, now)
            if planned is None:
                break
            params = {**planned.params, "recorded_at": now, **cap_params(admission)}
            written = await session.fetch_one(
                "enqueue_new", insert_params(planned.receipts, params)
            )
            if written is not None and written[0] is not None:
                return EnqueueResult(planned.folded, "created")
    return await _enqueue_locked(store, request, admission)  # a policy wants it, or caps moved


def plan_new(store: Store, request: EnqueueRequest, now: datetime) -> JobAppend | None:
    """The append of `request`'s new job (its `job.enqueued` receipt, folded) at the database
    clock `now`; None when a settlement policy wants it (it then takes the transaction)."""
    assert request.job_id is not None
    draft = Draft("job.enqueued", enqueued_data(request, request.job_id, now))
    planned = plan(request.job_id, None, [draft], now, owe_callbacks=store.owe_callbacks)
    if any(p.wants(None, planned.folded, planned.drafts) for p in store.policies):
        return None
    return planned


def cap_params(admission: Admission | None) -> dict[str, Any]:
    """The caps a new job's statement checks again at its own time (none without `admission`:
    no organization to count)."""
    return {
        "cap_organization_id": admission.organization_id if admission else None,
        "max_queued": admission.max_queued if admission else 1,
        "max_active": admission.max_active if admission else 1,
    }


def enqueued_data(request: EnqueueRequest, job_id: str, now: datetime) -> dict[str, Any]:
    """The `job.enqueued` receipt's data for `request`, at the database clock `now`."""
    data: dict[str, Any] = {
        "jobId": job_id,
        "agentId": request.agent_id,
        "lane": request.lane,
        "kind": request.kind,
        "payload": request.payload,
        "organizationId": request.organization_id,
        "sessionKey": request.session_key,
        "singletonMode": request.singleton_mode,
        "maxAttempts": request.max_attempts,
    }
    if request.delay_ms:
        data["availableAt"] = (now + timedelta(milliseconds=request.delay_ms)).isoformat()
    # A request with a trace context only (an agent job's turn) names its trace by it.
    trace_id = request.trace_id or trace_id_of(request.traceparent)
    if trace_id:
        data["traceId"] = trace_id
    if request.traceparent:
        data["traceparent"] = request.traceparent
    if request.retry_of:
        data["retryOf"] = request.retry_of
    return data


async def enqueue_in(
    tx: Tx, request: EnqueueRequest, admission: Admission | None = None
) -> EnqueueResult:
    """Enqueue inside a caller's transaction (see `enqueue`). `admission` is checked only where a
    job would be created: a re-post of an existing id and a steer absorbed into a live job create
    none, so an organization at its cap still gets them (the specification's safe retry)."""
    job_id = request.job_id
    if job_id is None:
        job_id = str(uuid.uuid4())
    elif not request.new_job_id:
        await tx.lock_key(job_lock_key(job_id))
        existing = await tx.job(job_id) or await tx.job_by_command(job_id)
        if existing is not None:
            if existing.organization_id != request.organization_id:
                raise ConflictError("jobId already in use")
            mismatch = not await _same_request(tx, existing, request, job_id)
            if mismatch:
                log.info(
                    "re-post with another agent or payload: the existing job is returned",
                    extra={"event": "enqueue.idempotency_mismatch", "jobId": existing.job_id},
                )
            outcome = "existing" if existing.job_id == job_id else "steered"
            return EnqueueResult(existing, outcome, idempotency_mismatch=mismatch)

    affected: list[Job] = []
    if request.session_key is not None:
        await tx.lock_key(session_lock_key(request.organization_id, request.session_key))
        active = await tx.session_active_for_update(request.organization_id, request.session_key)
        now = await tx.now()
        live: list[Job] = []
        for job in active:
            if jobmodel.lease_expired(job, now):
                job, _ = await tx.append_job(job.job_id, job, [expire_draft(job)])
                affected.append(job)
            if job.status in jobmodel.ACTIVE_STATUSES:
                live.append(job)
        if request.singleton_mode == "cancel":
            for job in live:
                draft = stop_draft(job, SINGLETON_CANCEL_REASON, str(uuid.uuid4()))
                job, _ = await tx.append_job(job.job_id, job, [draft])
                affected.append(job)
        elif request.singleton_mode == "steer" and live:
            target = max(live, key=lambda j: (j.created_at, j.job_id))
            if not request.may_steer_commands and runs_commands(target.agent_id, target.kind):
                # What a steer carries reaches the command (a steerable task reads it on stdin):
                # as `POST /jobs/{id}/commands`, it needs the right to run commands.
                raise NotPermitted(
                    "singletonMode",
                    "the session's active job runs commands: a steer absorbed into it needs "
                    "commands:run",
                )
            _check_command_caps(request, target)
            steer = command_draft(
                job_id,
                "steer",
                payload=request.payload,
                fromSessionKey=request.session_key,
                fromEnqueue=True,
            )
            steered, _ = await tx.append_job(target.job_id, target, [steer])
            return EnqueueResult(steered, "steered", tuple(affected))

    if admission is not None:
        # After a singleton cancel, whose appends count here: a refusal rolls them back too.
        row = await tx.fetch_one("enqueue_caps", {"organization_id": admission.organization_id})
        assert row is not None
        tx.clock_read(row[0])
        admission.refuse(int(row[1]), int(row[2]))
    data = enqueued_data(request, job_id, await tx.now())
    job, _ = await tx.append_job(job_id, None, [Draft("job.enqueued", data)])
    return EnqueueResult(job, "created", tuple(affected))


def _check_command_caps(request: EnqueueRequest, target: Job) -> None:
    """Refuse a steer the target job could not hold (commands pile up in its state)."""
    if request.max_commands is not None and len(target.commands) >= request.max_commands:
        raise InvalidInput(
            "singletonMode",
            f"the session's active job already holds {request.max_commands} commands "
            "(RECEIPT_MAX_COMMANDS_PER_JOB); this steer would not fit",
        )
    if request.max_command_bytes is not None:
        size = len(json.dumps(request.payload, separators=(",", ":")))
        if size > request.max_command_bytes:
            raise InvalidInput(
                "payload",
                f"a steer absorbed into an active job holds at most {request.max_command_bytes} "
                "bytes (RECEIPT_MAX_COMMAND_BYTES)",
            )


def expire_draft(job: Job) -> Draft:
    """Return the `job.lease_expired` receipt for a job whose lease the database clock passed."""
    assert job.lease is not None
    return Draft(
        "job.lease_expired",
        {
            "workerId": job.lease.worker_id,
            "attempt": job.lease.attempt,
            "expiresAt": job.lease.expires_at.isoformat(),
        },
    )


def command_draft(
    command_id: str, type_: str, *, payload: Any = None, reason: str | None = None, **origin: Any
) -> Draft:
    """Return the `queue.command` receipt of a steer or follow_up (in the lane of its type) or
    an abort; `origin` says where it came from (a steer absorbed at enqueue)."""
    lane = None if type_ == "abort" else type_
    data = {"commandId": command_id, "type": type_, "lane": lane, "payload": payload}
    return Draft("queue.command", {**data, "reason": reason, **origin})


def cancel_queued_draft(job: Job, reason: str | None) -> Draft:
    """Return the `job.canceled` receipt of a job still queued: no worker holds it."""
    return Draft("job.canceled", {"reason": reason, "attempt": job.attempt})


def stop_draft(job: Job, reason: str, command_id: str) -> Draft:
    """Stop a live job: a queued one is canceled outright; a leased or running one is sent an
    abort command (`command_id`), which its worker honours."""
    if job.status == "queued":
        return cancel_queued_draft(job, reason)
    return command_draft(command_id, "abort", reason=reason)
