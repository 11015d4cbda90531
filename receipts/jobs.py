"""The job model and its reducer: a job's state is a pure fold over the receipts of `jobs/<jobId>`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import ConfigDict
from pydantic.alias_generators import to_camel

from receipts import streams
from receipts.errors import InvariantError
from receipts.streams import CamelModel, Receipt, StreamState, time_of

LANES: tuple[str, ...] = ("chat", "collect", "steer", "follow_up")
DEFAULT_LANE = "collect"
STATUSES: tuple[str, ...] = ("queued", "leased", "running", "completed", "failed", "canceled")
ACTIVE_STATUSES: frozenset[str] = frozenset({"queued", "leased", "running"})
LEASED_STATUSES: frozenset[str] = frozenset({"leased", "running"})
TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "canceled"})
SINGLETON_MODES: tuple[str, ...] = ("allow", "cancel", "steer")
COMMAND_TYPES: tuple[str, ...] = ("steer", "follow_up", "abort")
COMMAND_LANES: tuple[str, ...] = ("steer", "follow_up")
RECEIPT_TYPES: tuple[str, ...] = (
    "job.enqueued",
    "job.leased",
    "job.heartbeat",
    "job.progress",
    "job.completed",
    "job.failed",
    "job.canceled",
    "queue.command",
    "queue.command.consumed",
    "job.lease_expired",
)
# Beyond the spec's ten: a terminal job that was retried records the new job's id. It changes
# no status (a terminal job never moves); it links the two jobs both ways (`retryOf` on the new
# job's `job.enqueued`).
RETRIED = "job.retried"
# Beyond the spec's ten, too: a steer or follow_up the job ended without reading is settled
# visibly, in the transaction of the receipt that ends the job and just before it (a job view
# never shows a command pending forever). `reason` says why (receipts/kinds.py).
UNCONSUMED = "queue.command.unconsumed"
DEFAULT_MAX_ATTEMPTS = 2
MIN_ATTEMPTS, MAX_ATTEMPTS = 1, 8
SINGLETON_CANCEL_REASON = "singleton cancel"
MAX_RETRY_DELAY_MS = 30_000

Status = Literal["queued", "leased", "running", "completed", "failed", "canceled"]

JOB_STREAM_PREFIX = "jobs/"


def job_stream(job_id: str) -> str:
    """Return the stream name of a job: `jobs/<jobId>`."""
    return JOB_STREAM_PREFIX + job_id


def job_id_of(stream: str) -> str:
    """Return the job id a `jobs/<jobId>` stream name addresses."""
    return stream.removeprefix(JOB_STREAM_PREFIX)


def no_job_message(job_id: str) -> str:
    """Return the spec's exact invariant text for an event addressed to a job that does not exist."""
    return f"Invariant: no job for {job_id}"


def lease_expired_message(attempts: int) -> str:
    """Return the error a job carries when its last attempt's lease expired."""
    return f"lease expired after {attempts} attempts"


class Lease(CamelModel):
    """The active fence: one delivery (`workerId`) of one attempt, valid until `expiresAt`."""

    worker_id: str
    attempt: int
    expires_at: datetime
    leased_at: datetime
    process: dict[str, Any] | None = None


class Command(CamelModel):
    """A queue command as the state keeps it: a reference to its `queue.command` receipt (`seq`)
    and small metadata, never the payload (receipts/commands.py reads it)."""

    command_id: str
    type: str
    seq: int | None = None  # None: stored before references; the receipt is found by its id
    lane: str | None = None
    reason: str | None = None
    from_session_key: str | None = None
    from_enqueue: bool = False
    recorded_at: datetime
    consumed_attempt: int | None = None
    unconsumed: str | None = None  # why the job ended without reading it
    # A state stored before references still reads: the `payload` it kept is dropped.
    model_config = ConfigDict(extra="ignore")

    @property
    def pending(self) -> bool:
        """True while a steer/follow_up has not been consumed by a live attempt (nor settled
        unconsumed when the job ended)."""
        return self.type != "abort" and self.consumed_attempt is None and self.unconsumed is None


class Job(StreamState):
    """The folded state of one job (the `jobs` projection row stores exactly this)."""

    STREAM_PREFIX = JOB_STREAM_PREFIX
    ID_FIELD = "job_id"
    TERMINAL = TERMINAL_STATUSES

    job_id: str
    agent_id: str
    lane: str
    kind: str
    payload: dict[str, Any]
    organization_id: str | None = None
    session_key: str | None = None
    singleton_mode: str = "allow"
    status: Status = "queued"
    attempt: int = 0
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    available_at: datetime | None = None
    lease: Lease | None = None
    last_heartbeat_at: datetime | None = None
    abort_requested: bool = False
    abort_reason: str | None = None
    commands: tuple[Command, ...] = ()
    progress: Any = None
    progress_count: int = 0
    result: Any = None
    error: str | None = None
    settlement_id: str | None = None
    canceled_reason: str | None = None
    trace_id: str | None = None
    traceparent: str | None = None
    retry_of: str | None = None
    retried_as: str | None = None

    @property
    def pending_commands(self) -> tuple[Command, ...]:
        """Steer/follow_up commands not yet consumed by the current attempt."""
        return tuple(c for c in self.commands if c.pending)


# Why a fenced write is refused (docs/design.md §4); the attempt's result statuses reuse the first four.
STALE_ATTEMPT = "stale_attempt"
LEASE_LOST = "lease_lost"
TERMINAL_STATE = "terminal_state"
NOT_FOUND = "not_found"


def fence_rejection(
    job: Job | None, worker_id: str | None, attempt: int | None, now: datetime | None = None
) -> str | None:
    """Why `(worker_id, attempt)` may not write to `job`, or None when it holds the fence.

    The one fence rule: the writer must be the active lease's delivery (`workerId`) of its
    attempt and, when `now` (the database clock) is given, the lease must not have expired.
    `stale_attempt`: the writer's attempt is older than the job's (or not the lease's);
    `lease_lost`: same attempt, but the lease was rebound to another delivery, released, or
    has expired; `terminal_state`: the job is already settled. A queued job has no lease: only
    a system settlement (no `workerId`) of its current attempt holds it.

    Operations and the worker's re-read pass `now`: a lease past its `expiresAt` is lost the
    moment the clock passes it, whether or not the recovery scan has appended
    `job.lease_expired` yet — the scan may be doing so right now. The reducer passes no clock:
    it folds receipts an operation already admitted under that clock (a fold must give the same
    state on any later day), and the system settlements — a stale or undeliverable job failed
    with its lease's own fence, `job.lease_expired` — are written after expiry on purpose.
    """
    if job is None:
        return NOT_FOUND
    if job.terminal:
        return TERMINAL_STATE
    if attempt is None or attempt < job.attempt:
        return STALE_ATTEMPT
    if job.status == "queued":
        return None if worker_id is None and attempt == job.attempt else LEASE_LOST
    if job.lease is None:
        return LEASE_LOST
    if job.lease.attempt != attempt:
        return STALE_ATTEMPT
    if job.lease.worker_id != worker_id:
        return LEASE_LOST
    if now is not None and job.lease.expires_at < now:
        return LEASE_LOST
    return None


def fence_matches(job: Job, worker_id: str | None, attempt: int | None) -> bool:
    """The reducer's form of `fence_rejection` (no clock): True when the writer holds the fence."""
    return fence_rejection(job, worker_id, attempt) is None


def settle_rejection(
    job: Job | None, worker_id: str, attempt: int, now: datetime | None, settlement_id: str
) -> str | None:
    """Why a settle by `(worker_id, attempt)` may not be written, or None when it may — or
    when the job is already settled under `settlement_id` (a retry of an ambiguous commit, which
    reports success without a second receipt). Used by the settle operations and by the
    worker's re-read before it settles, so both refuse exactly the same writes."""
    if job is not None and job.settlement_id == settlement_id:
        return None
    return fence_rejection(job, worker_id, attempt, now)


def _requeue_commands(job: Job, attempt: int) -> tuple[Command, ...]:
    """Commands consumed by an attempt that did not complete become pending again."""
    return tuple(
        c.model_copy(update={"consumed_attempt": None}) if c.consumed_attempt == attempt else c
        for c in job.commands
    )


def _create(receipt: Receipt) -> Job:
    data = receipt.data
    payload = dict(data.get("payload") or {})
    return Job(
        job_id=str(data.get("jobId") or job_id_of(receipt.stream)),
        agent_id=str(data["agentId"]),
        lane=str(data.get("lane") or DEFAULT_LANE),
        kind=str(data.get("kind") or payload.get("kind") or ""),
        payload=payload,
        organization_id=data.get("organizationId"),
        session_key=data.get("sessionKey"),
        singleton_mode=str(data.get("singletonMode") or "allow"),
        max_attempts=int(data.get("maxAttempts") or DEFAULT_MAX_ATTEMPTS),
        available_at=time_of(data, "availableAt"),
        trace_id=data.get("traceId"),
        traceparent=data.get("traceparent"),
        retry_of=data.get("retryOf"),
        created_at=receipt.recorded_at,
        updated_at=receipt.recorded_at,
        seq=receipt.seq,
    )


def apply(job: Job | None, receipt: Receipt) -> Job | None:
    """Fold one receipt into a job's state and return the new state.

    Raises `InvariantError` (`Invariant: no job for <jobId>`) for an event addressed to a job
    that does not exist, except `job.failed` and `job.lease_expired`, which are ignored so a late
    settlement cannot break a fold. Receipts the state does not admit (a lease on a job that is
    not queued, a write from a superseded fence, anything on a terminal job) leave it unchanged
    apart from its `seq`.
    """
    kind = receipt.type
    data = receipt.data
    if job is None:
        if kind == "job.enqueued":
            return _create(receipt)
        if kind in ("job.failed", "job.lease_expired"):
            return None
        raise InvariantError(no_job_message(job_id_of(receipt.stream)))

    changes = _changes(job, receipt, kind, data)
    base = {"seq": receipt.seq}
    if changes:
        base["updated_at"] = receipt.recorded_at  # type: ignore[assignment]
        base.update(changes)
    return job.model_copy(update=base)


def _changes(job: Job, receipt: Receipt, kind: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """Return the fields a receipt changes, or an empty dict when the receipt is inert."""
    if kind == RETRIED:
        # Only a terminal job is retried, once: the first retry's id is kept, unless retention
        # pruned that retry and the job was retried again (`replaces` names it: receipts/retry.py).
        again = job.retried_as is not None and data.get("replaces") == job.retried_as
        if job.terminal and (job.retried_as is None or again):
            return {"retried_as": str(data["retriedAs"])}
        return {}
    if job.terminal:
        return {}
    at = receipt.recorded_at
    if kind == "job.leased":
        if job.status != "queued":
            return {}
        attempt = job.attempt + 1
        return {
            "status": "leased",
            "attempt": attempt,
            "lease": Lease(
                worker_id=str(data["workerId"]),
                attempt=attempt,
                expires_at=time_of(data, "expiresAt") or at,
                leased_at=at,
                process=data.get("process"),
            ),
            "last_heartbeat_at": at,
            # A new lease is a new settlement: a retried settle of an earlier delivery must not
            # match it (delivery ids repeat after a refunded attempt).
            "settlement_id": None,
        }
    if kind == "job.heartbeat":
        return _heartbeat(job, at, data)
    if kind == "job.progress":
        if not fence_matches(job, data.get("workerId"), data.get("attempt")) or job.lease is None:
            return {}
        return {"progress": data.get("data"), "progress_count": job.progress_count + 1}
    if kind == "job.completed":
        if not fence_matches(job, data.get("workerId"), data.get("attempt")) or job.lease is None:
            return {}
        return {
            "status": "completed",
            "result": data.get("result"),
            "error": None,
            "settlement_id": data.get("settlementId"),
            "lease": None,
            "settled_at": at,
        }
    if kind == "job.failed":
        return _failed(job, at, data)
    if kind == "job.canceled":
        worker_id = data.get("workerId")
        if worker_id is None and job.status != "queued":
            return {}
        if worker_id is not None and not fence_matches(job, worker_id, data.get("attempt")):
            return {}
        return {
            "status": "canceled",
            "canceled_reason": data.get("reason"),
            "settlement_id": data.get("settlementId"),
            "lease": None,
            "settled_at": at,
        }
    if kind == "queue.command":
        command = Command(
            command_id=str(data["commandId"]),
            type=str(data["type"]),
            seq=receipt.seq,
            lane=data.get("lane"),
            reason=data.get("reason"),
            from_session_key=data.get("fromSessionKey"),
            from_enqueue=bool(data.get("fromEnqueue", False)),
            recorded_at=at,
        )
        changes: dict[str, Any] = {"commands": (*job.commands, command)}
        if command.type == "abort":
            changes["abort_requested"] = True
            changes["abort_reason"] = command.reason
        return changes
    if kind == "queue.command.consumed":
        if not fence_matches(job, data.get("workerId"), data.get("attempt")) or job.lease is None:
            return {}
        command_id = data.get("commandId")
        if not any(c.command_id == command_id and c.pending for c in job.commands):
            return {}
        return {
            "commands": tuple(
                c.model_copy(update={"consumed_attempt": job.attempt})
                if c.command_id == command_id
                else c
                for c in job.commands
            )
        }
    if kind == UNCONSUMED:
        command_id = data.get("commandId")
        if not any(c.command_id == command_id and c.pending for c in job.commands):
            return {}
        reason = str(data.get("reason") or "unread")
        return {
            "commands": tuple(
                c.model_copy(update={"unconsumed": reason}) if c.command_id == command_id else c
                for c in job.commands
            )
        }
    if kind == "job.lease_expired":
        if job.status not in LEASED_STATUSES or job.lease is None:
            return {}
        if data.get("attempt") != job.lease.attempt or data.get("workerId") != job.lease.worker_id:
            return {}
        if job.attempt < job.max_attempts:
            return {
                "status": "queued",
                "lease": None,
                "commands": _requeue_commands(job, job.attempt),
            }
        return {
            "status": "failed",
            "error": lease_expired_message(job.attempt),
            "lease": None,
            "settled_at": at,
        }
    if kind == "job.enqueued":
        return {}
    raise InvariantError(f"Invariant: unknown receipt type {kind!r} on {receipt.stream}")


def _heartbeat(job: Job, at: datetime, data: Mapping[str, Any]) -> dict[str, Any]:
    if job.status not in LEASED_STATUSES or job.lease is None:
        return {}
    worker_id, attempt = data.get("workerId"), data.get("attempt")
    if data.get("startFence"):
        if attempt != job.lease.attempt or worker_id is None:
            return {}
    elif not fence_matches(job, worker_id, attempt):
        return {}
    update: dict[str, Any] = {
        "worker_id": str(worker_id),
        "expires_at": time_of(data, "expiresAt") or at,
    }
    if data.get("startFence") and data.get("process") is not None:
        update["process"] = data["process"]
    lease = job.lease.model_copy(update=update)
    changes: dict[str, Any] = {"status": "running", "lease": lease, "last_heartbeat_at": at}
    if data.get("startFence") and data.get("commandsPending"):
        # A takeover (written so since the flag exists: older streams fold as they did).
        changes["commands"] = _requeue_commands(job, job.lease.attempt)
    return changes


def _failed(job: Job, at: datetime, data: Mapping[str, Any]) -> dict[str, Any]:
    if not fence_matches(job, data.get("workerId"), data.get("attempt")):
        return {}
    refund = bool(data.get("refundAttempt", False))
    attempt = job.attempt - 1 if refund and job.attempt > 0 else job.attempt
    retryable = bool(data.get("retryable", False))
    if retryable and (refund or job.attempt < job.max_attempts):
        requeued: dict[str, Any] = {
            "status": "queued",
            "attempt": attempt,
            "lease": None,
            "error": data.get("error"),
            "settlement_id": data.get("settlementId"),
            "commands": _requeue_commands(job, job.attempt),
        }
        delay = retry_delay_ms(data.get("retryDelayMs"))
        if delay:
            # The dispatcher and the driver do not deliver it before this database time.
            requeued["available_at"] = at + timedelta(milliseconds=delay)
        return requeued
    changes: dict[str, Any] = {
        "status": "failed",
        "error": data.get("error"),
        "settlement_id": data.get("settlementId"),
        "lease": None,
        "settled_at": at,
    }
    result = data.get("result")
    if not retryable and data.get("status"):
        result = {**(result if isinstance(result, dict) else {}), "status": data["status"]}
    changes["result"] = result
    return changes


def retry_delay_ms(value: Any) -> int:
    """A retryable failure's `retryDelayMs`, clamped to 0..`MAX_RETRY_DELAY_MS` (0: none)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return max(0, min(MAX_RETRY_DELAY_MS, value))


def fold(receipts: Iterable[Receipt], job: Job | None = None) -> Job | None:
    """Fold receipts in order, starting from `job` (None: the empty stream)."""
    return streams.fold(apply, receipts, job)


def lease_expired(job: Job, now: datetime) -> bool:
    """True when the job holds a lease whose `expiresAt` the database clock `now` has passed."""
    return job.status in LEASED_STATUSES and job.lease is not None and job.lease.expires_at < now


def stale_lease(job: Job, now: datetime, active_stale_ms: int) -> bool:
    """The driver's stale active lease: expired, or no heartbeat within `active_stale_ms`."""
    if job.status not in LEASED_STATUSES or job.lease is None:
        return False
    if lease_expired(job, now):
        return True
    last = job.last_heartbeat_at or job.lease.leased_at
    return now - last > timedelta(milliseconds=active_stale_ms)


# The fields of the folded state a plain heartbeat changes; they live in the job's narrow lease
# row (`job_leases.patch`) until the next change of anything else rewrites the jobs row.
LEASE_PATCH_FIELDS: tuple[str, ...] = ("seq", "updated_at", "last_heartbeat_at", "lease")


def lease_patch(before: Job | None, after: Job) -> dict[str, Any] | None:
    """Return the lease-row patch when `after` differs from `before` only as a heartbeat makes it
    differ (stream head, update time, last heartbeat, the same lease with a new expiry), as the
    camelCase JSON the projection's `state` holds; None when anything else changed.
    """
    if before is None or before.lease is None or after.lease is None:
        return None
    if after.status not in LEASED_STATUSES or after.status != before.status:
        return None
    if after.lease.model_copy(update={"expires_at": before.lease.expires_at}) != before.lease:
        return None
    unchanged = after.model_copy(update={f: getattr(before, f) for f in LEASE_PATCH_FIELDS})
    if unchanged != before:
        return None
    state = after.to_json()
    return {to_camel(f): state[to_camel(f)] for f in LEASE_PATCH_FIELDS}
