"""Enqueue: in one transaction apply idempotency, singleton mode and append (the request is
validated by receipts/enqueue_request.py, whose names this module also answers to)."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from receipts import jobs as jobmodel
from receipts.commands import with_payloads
from receipts.enqueue_request import JOB_ID_PATTERN as JOB_ID_PATTERN
from receipts.enqueue_request import EnqueueBody as EnqueueBody
from receipts.enqueue_request import EnqueueRequest as EnqueueRequest
from receipts.enqueue_request import choice_field as choice_field
from receipts.enqueue_request import parse_enqueue as parse_enqueue
from receipts.errors import ConflictError, InvalidInput, NotPermitted
from receipts.job_append import JobAppend, insert_params, plan
from receipts.jobs import SINGLETON_CANCEL_REASON, Job
from receipts.kinds import runs_commands
from receipts.store import Draft, Store, Tx
from receipts.streams import same_json
from receipts.trace_context import trace_id_of

log = logging.getLogger("receipts.enqueue")


NEW_JOB_TRIES = 3
"""Reads and statements a new job's write makes while its caps move in between, before it
takes the locked path (`enqueue_new`; receipts/enqueue_batch.py likewise for a batch)."""


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
        return existing.agent_id == request.agent_id and same_json(existing.payload, payload)
    command = next((c for c in existing.commands if c.command_id == job_id), None)
    if command is None:
        return True
    [read] = await with_payloads(tx, existing.job_id, [command])
    return same_json(read.payload, request.payload)


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


@dataclass(frozen=True, slots=True)
class OrgCaps:
    """An organization's caps of open jobs (`RECEIPT_ORG_MAX_QUEUED`, `RECEIPT_ORG_MAX_ACTIVE`)
    as the runtime's own fan-out is held to them (objective control's task dispatch), where
    the api's `Admission` refuses a request; and the operator's `RECEIPT_MAX_TIMEOUT_MS`, to
    which that dispatch clamps a task's `timeoutMs` as the api clamps a posted job's (None:
    no cap)."""

    max_queued: int
    max_active: int
    max_timeout_ms: int | None = None

    def room(self, queued: int, active: int) -> int:
        """How many more open jobs the organization may have, holding `queued` and `active`."""
        return min(self.max_queued - queued, self.max_active - active)


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
