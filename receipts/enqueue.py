"""Enqueue: validate a request, then in one transaction apply idempotency, singleton mode and append."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from receipts import jobs as jobmodel
from receipts.errors import ConflictError, InvalidInput
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
from receipts.kinds import validate_payload
from receipts.store import Draft, Store, Tx
from receipts.text import check_clean_text

log = logging.getLogger("receipts.enqueue")

MAX_ID_LENGTH = 200
MAX_DELAY_MS = 7 * 24 * 3600 * 1000


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

    @property
    def created(self) -> bool:
        """True when a new job was appended."""
        return self.outcome == "created"


# Temporal workflow ids are derived from job ids (`<jobId>:gen:<g>`, `<jobId>:attempt:<n>`), and
# stream names from `jobs/<jobId>`; a job id that looks like one of those is refused.
RESERVED_ID_PARTS: tuple[str, ...] = (":gen:", ":attempt:", ":redrive:", "/")
RESERVED_ID_PREFIX = "watchdog:"


def _optional_id(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(name, f"{name} must be a non-empty string")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidInput(name, f"{name} must be at most {MAX_ID_LENGTH} characters")
    return value


def _check_job_id(job_id: str | None, kind: str) -> None:
    if job_id is None:
        return
    for part in RESERVED_ID_PARTS:
        if part in job_id:
            raise InvalidInput(
                "jobId",
                f"jobId must not contain {part!r} (reserved for delivery ids and stream names)",
            )
    if job_id.startswith(RESERVED_ID_PREFIX) and kind != "factory.objective.watchdog":
        raise InvalidInput(
            "jobId", f"jobId prefix {RESERVED_ID_PREFIX!r} is reserved for the objective watchdog"
        )


def _choice(body: Mapping[str, Any], name: str, allowed: tuple[str, ...], default: str) -> str:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, str) or value not in allowed:
        raise InvalidInput(
            name, f"{name} must be one of: {', '.join(allowed)} (got {value!r})", allowed
        )
    return value


def clamp_attempts(value: int) -> int:
    """Clamp `maxAttempts` to the spec's range 1..8."""
    return max(MIN_ATTEMPTS, min(MAX_ATTEMPTS, value))


def parse_enqueue(agent_id: str, body: Mapping[str, Any]) -> EnqueueRequest:
    """Validate an enqueue body for `agent_id`; raise `InvalidInput` naming the field at fault."""
    if not isinstance(agent_id, str) or not agent_id.strip() or len(agent_id) > MAX_ID_LENGTH:
        raise InvalidInput(
            "agentId", f"agentId must be a non-empty string of at most {MAX_ID_LENGTH} characters"
        )
    if not isinstance(body, Mapping):
        raise InvalidInput("body", "the request body must be a JSON object")
    check_clean_text(body, "")
    check_clean_text(agent_id, "agentId")
    payload = body.get("payload")
    kind, organization_id = validate_payload(payload)
    assert isinstance(payload, Mapping)
    max_attempts = body.get("maxAttempts", DEFAULT_MAX_ATTEMPTS)
    if max_attempts is None:
        max_attempts = DEFAULT_MAX_ATTEMPTS
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
        raise InvalidInput(
            "maxAttempts",
            f"maxAttempts must be an integer (it is clamped to {MIN_ATTEMPTS}..{MAX_ATTEMPTS})",
        )
    delay_ms = body.get("delayMs")
    if delay_ms is None:
        delay_ms = 0
    if (
        isinstance(delay_ms, bool)
        or not isinstance(delay_ms, int)
        or not (0 <= delay_ms <= MAX_DELAY_MS)
    ):
        raise InvalidInput("delayMs", f"delayMs must be an integer in 0..{MAX_DELAY_MS}")
    job_id = _optional_id(body, "jobId")
    _check_job_id(job_id, kind)
    return EnqueueRequest(
        agent_id=agent_id,
        payload=dict(payload),
        kind=kind,
        organization_id=organization_id,
        job_id=job_id,
        lane=_choice(body, "lane", LANES, DEFAULT_LANE),
        session_key=_optional_id(body, "sessionKey"),
        singleton_mode=_choice(body, "singletonMode", SINGLETON_MODES, "allow"),
        max_attempts=clamp_attempts(max_attempts),
        delay_ms=delay_ms,
    )


def session_lock_key(organization_id: str | None, session_key: str) -> str:
    """Return the advisory-lock key of a session key, scoped by organization."""
    return f"session:{organization_id or ''}:{session_key}"


def job_lock_key(job_id: str) -> str:
    """Return the advisory-lock key that serialises enqueues naming one jobId."""
    return f"job:{job_id}"


async def enqueue(store: Store, request: EnqueueRequest) -> EnqueueResult:
    """Enqueue in one transaction, in docs/design.md §4's order.

    1. jobId lookup: an existing job (or the job a steer with this id was absorbed into) is
       returned unchanged; one owned by another organization raises `ConflictError`.
    2. the session-key lock; 3. expiry of stale leases on the session key; 4. the singleton
    scan; 5. append `job.enqueued`.
    """
    async with store.transaction() as tx:
        return await enqueue_in(tx, request)


async def enqueue_in(tx: Tx, request: EnqueueRequest) -> EnqueueResult:
    """Enqueue inside a caller's transaction (see `enqueue`)."""
    job_id = request.job_id
    if job_id is not None:
        await tx.lock_key(job_lock_key(job_id))
        existing = await tx.job(job_id) or await tx.job_by_command(job_id)
        if existing is not None:
            if existing.organization_id != request.organization_id:
                raise ConflictError("jobId already in use")
            outcome = "existing" if existing.job_id == job_id else "steered"
            return EnqueueResult(existing, outcome)
    else:
        job_id = str(uuid.uuid4())

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
                draft = singleton_cancel_draft(job)
                job, _ = await tx.append_job(job.job_id, job, [draft])
                affected.append(job)
        elif request.singleton_mode == "steer" and live:
            target = max(live, key=lambda j: (j.created_at, j.job_id))
            steered, _ = await tx.append_job(
                target.job_id,
                target,
                [
                    Draft(
                        "queue.command",
                        {
                            "commandId": job_id,
                            "type": "steer",
                            "lane": "steer",
                            "payload": request.payload,
                            "reason": None,
                            "fromSessionKey": request.session_key,
                            "fromEnqueue": True,
                        },
                    )
                ],
            )
            return EnqueueResult(steered, "steered", tuple(affected))

    now = await tx.now()
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
    if request.trace_id:
        data["traceId"] = request.trace_id
    if request.traceparent:
        data["traceparent"] = request.traceparent
    if request.retry_of:
        data["retryOf"] = request.retry_of
    job, _ = await tx.append_job(job_id, None, [Draft("job.enqueued", data)])
    return EnqueueResult(job, "created", tuple(affected))


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


def singleton_cancel_draft(job: Job) -> Draft:
    """A queued job is canceled outright; a leased/running one is sent an abort command."""
    if job.status == "queued":
        return Draft("job.canceled", {"reason": SINGLETON_CANCEL_REASON, "attempt": job.attempt})
    return Draft(
        "queue.command",
        {
            "commandId": str(uuid.uuid4()),
            "type": "abort",
            "lane": None,
            "payload": None,
            "reason": SINGLETON_CANCEL_REASON,
        },
    )
