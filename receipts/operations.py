"""Fenced job operations used by delivery: lease, heartbeat, progress, settle, commands, expiry.

Each operation is one transaction: lock the job's projection row, decide against the folded
state and the database clock, append, or write nothing and return why (an `Outcome` status).
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from typing import Any

from receipts import jobs as jobmodel
from receipts.delivery_ids import newer_delivery
from receipts.enqueue import cancel_queued_draft, command_draft, expire_draft
from receipts.jobs import (
    COMMAND_TYPES,
    LEASE_LOST,
    LEASED_STATUSES,
    NOT_FOUND,
    STALE_ATTEMPT,
    TERMINAL_STATE,
    Job,
    fence_rejection,
    settle_rejection,
)
from receipts.mutate import OK as OK
from receipts.mutate import SETTLEMENT_CONFLICT as SETTLEMENT_CONFLICT
from receipts.mutate import Decide, Decision, Known, Outcome, Write, mutate, mutate_guarded, written
from receipts.plan import Step, next_step
from receipts.store import Draft, Store
from receipts.text import sanitize

log = logging.getLogger("receipts.operations")

# A failure's error text: in the job's row, its reads, its stream and its callbacks.
MAX_ERROR_CHARS = 4_000

# Other refusals (beside `receipts.mutate`'s OK and SETTLEMENT_CONFLICT).
NOT_QUEUED = "not_queued"
NOT_AVAILABLE = "not_available"
NOT_EXPIRED = "not_expired"
NOT_STALE = "not_stale"
NOT_PENDING = "not_pending"
AGENT_JOB_NOT_RUNNING = "agent_job_not_running"
TOO_MANY_COMMANDS = "too_many_commands"
COMMAND_ID_TAKEN = "command_id_taken"  # a command sent again under its id, but another type
ABORT_REQUESTED = "abort_requested"  # a completion that found an abort: the worker cancels
PROGRESS, CONSUMED = "job.progress", "queue.command.consumed"


async def _fenced(store: Store, job_id: str, worker_id: str, attempt: int, write: Write) -> Outcome:
    """`mutate` under the fence: a writer that does not hold it (`fence_rejection`, with the
    database clock) writes nothing; for one that does, `write` decides."""

    def decide(job: Job | None, now: datetime) -> Decision:
        rejection = fence_rejection(job, worker_id, attempt, now)
        if rejection:
            return rejection
        assert job is not None
        return write(job, now)

    return await mutate_guarded(store, job_id, decide)


async def _unsettled(store: Store, job_id: str, write: Write) -> Outcome:
    """`mutate` for a write no delivery makes (no fence): a job that does not exist is
    `not_found`, a settled one `terminal_state`; for any other, `write` decides."""

    def decide(job: Job | None, now: datetime) -> Decision:
        if job is None:
            return NOT_FOUND
        if job.terminal:
            return TERMINAL_STATE
        return write(job, now)

    return await mutate(store, job_id, decide)


def _lease_data(worker_id: str, attempt: int, now: datetime, lease_ms: int) -> dict[str, Any]:
    """The delivery and attempt a lease or heartbeat is for, and the lease's new `expiresAt`."""
    expires = now + timedelta(milliseconds=lease_ms)
    return {"workerId": worker_id, "attempt": attempt, "expiresAt": expires.isoformat()}


def _lease_decision(
    job: Job | None,
    now: datetime,
    attempt: int,
    worker_id: str,
    lease_ms: int,
    process: dict[str, Any] | None,
) -> Decision:
    plan = next_step(job, now)
    if plan.step is Step.MISSING:
        return NOT_FOUND
    if plan.step is Step.TERMINAL:
        return TERMINAL_STATE
    assert job is not None
    lease_held = job.lease is not None and (job.lease.worker_id, job.lease.attempt)
    if job.status in LEASED_STATUSES and lease_held == (worker_id, attempt):
        # A storage retry of a lease whose commit was ambiguous: it is ours already.
        return Outcome(OK, job, already=True)
    if attempt <= job.attempt:
        return STALE_ATTEMPT
    if attempt != plan.attempt:  # not queued, or queued for another attempt
        return NOT_QUEUED
    if plan.step is Step.NOT_AVAILABLE:
        return NOT_AVAILABLE
    # DELIVER, or ABORT: the worker leases and then honours the abort (the spec's order), so an
    # abort that raced a delivery is settled `canceled` by that delivery.
    data = {**_lease_data(worker_id, attempt, now, lease_ms), "leaseMs": lease_ms}
    if process:
        data["process"] = process
    return [Draft("job.leased", data)]


def _heartbeat_decision(
    job: Job | None,
    now: datetime,
    attempt: int,
    worker_id: str,
    lease_ms: int,
    start_fence: bool,
    process: dict[str, Any] | None,
) -> Decision:
    if start_fence:
        holder = job.lease.worker_id if job and job.lease else worker_id
        rejection = fence_rejection(job, holder, attempt, now)
        if rejection is None and holder != worker_id and not newer_delivery(worker_id, holder):
            # Only a later delivery of the attempt may take the lease over; a stalled
            # earlier one waking up must not evict its own redelivery.
            rejection = LEASE_LOST
    else:
        rejection = fence_rejection(job, worker_id, attempt, now)
    if rejection:
        return rejection
    data = _lease_data(worker_id, attempt, now, lease_ms)
    if start_fence:
        data["startFence"] = True
        if process:
            data["process"] = process
        if job and job.lease and job.lease.worker_id != worker_id:
            # A takeover runs its handler afresh: what the one before consumed is pending again.
            data["commandsPending"] = True
    return [Draft("job.heartbeat", data)]


async def start_attempt(
    store: Store,
    job_id: str,
    *,
    attempt: int,
    worker_id: str,
    lease_ms: int,
    process: dict[str, Any] | None = None,
) -> Outcome:
    """Take attempt `attempt` for delivery `worker_id` and start it, in one transaction.

    A queued job is leased and gets its first heartbeat in the same append (`job.leased`,
    `job.heartbeat`: leased → running, the spec's path in one round trip). A job already leased
    for this attempt is a redelivery: the lease is taken over with a start-fence heartbeat, and
    the same rules as `heartbeat(start_fence=True)` apply. A retry of an ambiguous commit finds
    the lease its own and reports success without writing.
    """

    def decide(job: Job | None, now: datetime) -> Decision:
        if job is None or job.terminal or job.status not in LEASED_STATUSES:
            drafts = _lease_decision(job, now, attempt, worker_id, lease_ms, process)
            if not isinstance(drafts, list):
                return drafts
            first = _lease_data(worker_id, attempt, now, lease_ms)
            return [*drafts, Draft("job.heartbeat", first)]
        held = job.lease is not None and (job.lease.worker_id, job.lease.attempt)
        if held == (worker_id, attempt):
            if job.status == "running":
                # A retry of an ambiguous commit: ours already, while the lease lasts.
                rejection = fence_rejection(job, worker_id, attempt, now)
                return rejection or Outcome(OK, job, already=True)
            return _heartbeat_decision(job, now, attempt, worker_id, lease_ms, False, None)
        return _heartbeat_decision(job, now, attempt, worker_id, lease_ms, True, process)

    return await mutate_guarded(store, job_id, decide)


async def lease(
    store: Store,
    job_id: str,
    *,
    attempt: int,
    worker_id: str,
    lease_ms: int,
    process: dict[str, Any] | None = None,
) -> Outcome:
    """Lease attempt `attempt` of a queued job for one delivery `worker_id`.

    Only the expected next attempt may lease, so a late retry of an old attempt can never take a
    newer attempt's place. `expiresAt` is the database clock plus `lease_ms`.
    """

    def decide(job: Job | None, now: datetime) -> Decision:
        return _lease_decision(job, now, attempt, worker_id, lease_ms, process)

    return await mutate_guarded(store, job_id, decide)


async def heartbeat(
    store: Store,
    job_id: str,
    *,
    worker_id: str,
    attempt: int,
    lease_ms: int,
    start_fence: bool = False,
    process: dict[str, Any] | None = None,
) -> Outcome:
    """Extend the lease to now + `lease_ms`; the first heartbeat promotes `leased → running`.

    A start-fence heartbeat (a redelivered execution of the same attempt) matches on `attempt`
    alone and rebinds the lease to `worker_id` (and records its `process`), so the earlier
    delivery's next write is rejected; for any other attempt it is inert, and so is one from a
    delivery older than the lease's holder.
    """

    def decide(job: Job | None, now: datetime) -> Decision:
        return _heartbeat_decision(job, now, attempt, worker_id, lease_ms, start_fence, process)

    return await mutate_guarded(store, job_id, decide)


async def progress(
    store: Store,
    job_id: str,
    *,
    worker_id: str,
    attempt: int,
    data: Any,
    write_id: str | None = None,
    again: bool = False,
) -> Outcome:
    """Record handler progress under the fence; `write_id` names this one write (its receipt
    carries it). `again`: a storage retry, whose earlier try may have committed with its answer
    lost; the receipt of `write_id`, if found, is that try's (`already`), under the fence."""
    body = {"workerId": worker_id, "attempt": attempt, "data": sanitize(data)}
    if write_id is not None:
        body["writeId"] = write_id
    mine = again and write_id is not None and await written(store, job_id, PROGRESS, write_id)

    def write(job: Job, now: datetime) -> Decision:
        return Outcome(OK, job, already=True) if mine else [Draft(PROGRESS, body)]

    return await _fenced(store, job_id, worker_id, attempt, write)


async def _settle(
    store: Store,
    job_id: str,
    worker_id: str,
    attempt: int,
    settlement_id: str | None,
    settled: Draft,
    known: Known | None = None,
    abort_wins: bool = False,
) -> Outcome:
    """The one settle path: under the fence (`settle_rejection`), append `settled` with the
    delivery, its attempt and its settlement id added to its data; a retry that finds its own
    settlement already committed reports success without a second receipt. `known`: the
    worker's re-read (the job and the database clock), decided on and guarded against. With
    `abort_wins`, a job found with an abort requested is refused `abort_requested` (nothing
    written): each decision, the one on `known` and every one made again on a newer read after
    a guarded write was refused, honours an abort that committed before it."""
    settlement = settlement_id or worker_id

    def decide(job: Job | None, now: datetime) -> Decision:
        rejection = settle_rejection(job, worker_id, attempt, now, settlement)
        if rejection:
            return rejection
        assert job is not None
        if job.settlement_id == settlement:
            return Outcome(OK, job, already=True)
        if abort_wins and job.abort_requested:
            return ABORT_REQUESTED
        fence = {"workerId": worker_id, "attempt": attempt, "settlementId": settlement}
        return [Draft(settled.type, {**fence, **settled.data})]

    return await mutate_guarded(store, job_id, decide, known)


async def complete(
    store: Store,
    job_id: str,
    *,
    worker_id: str,
    attempt: int,
    result: Any = None,
    settlement_id: str | None = None,
    known: Known | None = None,
    abort_wins: bool = False,
) -> Outcome:
    """Settle `completed` under the fence; a retry that finds its own settlement reports success.
    `abort_wins` (the worker's settle): a job with an abort requested is not completed but
    refused `abort_requested`, for the worker to cancel it."""
    draft = Draft("job.completed", {"result": sanitize(result)})
    return await _settle(store, job_id, worker_id, attempt, settlement_id, draft, known, abort_wins)


def bounded_error(error: str) -> str:
    """`error`, cut to at most `MAX_ERROR_CHARS` saying how much was cut (so a cut error is not
    cut again)."""
    if len(error) <= MAX_ERROR_CHARS:
        return error
    keep = MAX_ERROR_CHARS - 48  # room for the note
    return f"{error[:keep]}… ({len(error) - keep} more characters cut)"


async def fail(
    store: Store,
    job_id: str,
    *,
    worker_id: str,
    attempt: int,
    error: str,
    retryable: bool,
    status: str | None = None,
    refund_attempt: bool = False,
    result: Any = None,
    settlement_id: str | None = None,
    known: Known | None = None,
    retry_delay_ms: int | None = None,
) -> Outcome:
    """Settle `failed` under the fence.

    Retryable with attempts left (or `refund_attempt`, a graceful release) requeues the job
    (not deliverable before `retry_delay_ms`, at most 30 s, when given); otherwise it is
    terminal, and a non-retryable failure copies `status` onto `job.result`.
    """
    fields: dict[str, Any] = {"error": sanitize(bounded_error(error)), "retryable": retryable}
    if status:
        fields["status"] = status
    if refund_attempt:
        fields["refundAttempt"] = True
    if retryable and retry_delay_ms:
        fields["retryDelayMs"] = retry_delay_ms
    if result is not None:
        fields["result"] = sanitize(result)
    draft = Draft("job.failed", fields)
    return await _settle(store, job_id, worker_id, attempt, settlement_id, draft, known)


async def cancel(
    store: Store,
    job_id: str,
    *,
    worker_id: str,
    attempt: int,
    reason: str | None,
    settlement_id: str | None = None,
    known: Known | None = None,
) -> Outcome:
    """Settle `canceled` under the fence (a worker honouring an abort)."""
    draft = Draft("job.canceled", {"reason": sanitize(reason)})
    return await _settle(store, job_id, worker_id, attempt, settlement_id, draft, known)


async def cancel_queued(store: Store, job_id: str, *, reason: str | None) -> Outcome:
    """Cancel a job that is still queued (an abort honoured before any worker leased it)."""

    def write(job: Job, now: datetime) -> Decision:
        if job.status != "queued":
            return NOT_QUEUED
        return [cancel_queued_draft(job, reason)]

    return await _unsettled(store, job_id, write)


async def fail_undeliverable(store: Store, job_id: str, *, error: str) -> Outcome:
    """Fail a job non-retryably because it cannot be delivered (e.g. out of generations).

    A queued job is failed with no lease (`workerId: null`, a system settlement); a leased one
    with its active lease's own fence.
    """

    def write(job: Job, now: datetime) -> Decision:
        worker_id = job.lease.worker_id if job.lease is not None else None
        data = {
            "workerId": worker_id,
            "attempt": job.lease.attempt if job.lease is not None else job.attempt,
            "error": error,
            "retryable": False,
            "status": "failed",
        }
        return [Draft("job.failed", data)]

    return await _unsettled(store, job_id, write)


async def fail_stale(store: Store, job_id: str, *, active_stale_ms: int, error: str) -> Outcome:
    """The driver's stale active lease: fail it (retryable) with the stale lease's own fence."""

    def write(job: Job, now: datetime) -> Decision:
        if not jobmodel.stale_lease(job, now, active_stale_ms) or job.lease is None:
            return NOT_STALE
        data = {
            "workerId": job.lease.worker_id,
            "attempt": job.lease.attempt,
            "settlementId": f"{job.lease.worker_id}:stale",
            "error": error,
            "retryable": True,
        }
        return [Draft("job.failed", data)]

    return await _unsettled(store, job_id, write)


async def expire_lease(store: Store, job_id: str) -> Outcome:
    """Append `job.lease_expired` only when the database clock has passed the lease's expiry."""

    def write(job: Job, now: datetime) -> Decision:
        return [expire_draft(job)] if jobmodel.lease_expired(job, now) else NOT_EXPIRED

    return await _unsettled(store, job_id, write)


async def consume_command(
    store: Store,
    job_id: str,
    *,
    worker_id: str,
    attempt: int,
    command_id: str,
    write_id: str | None = None,
    again: bool = False,
) -> Outcome:
    """Mark a pending steer/follow_up as consumed by this attempt, under the fence; `write_id`
    names this one write. `again`: a storage retry, whose earlier try may have committed with
    its answer lost; the consumption carrying `write_id`, if found, is that try's (`already`),
    never one another delivery (or another consume of this one) made."""
    mine = again and write_id is not None and await written(store, job_id, CONSUMED, write_id)

    def write(job: Job, now: datetime) -> Decision:
        if mine:
            return Outcome(OK, job, already=True)
        if not any(c.command_id == command_id and c.pending for c in job.commands):
            return NOT_PENDING
        data = {"commandId": command_id, "attempt": attempt, "workerId": worker_id}
        return [Draft(CONSUMED, data if write_id is None else {**data, "writeId": write_id})]

    return await _fenced(store, job_id, worker_id, attempt, write)


async def add_command(store: Store, job_id: str, **command: Any) -> Outcome:
    """Append a `queue.command` to a job that is not terminal, as `command_decision` decides
    (its keywords). An agent job's turn takes its steers and follow-ups through
    receipts/agent_jobs/interventions.py `add_command`."""
    return await mutate(store, job_id, command_decision(**command))


def command_decision(
    *,
    type: str,
    payload: Any = None,
    reason: str | None = None,
    organization_id: str | None = None,
    check_organization: bool = True,
    command_id: str | None = None,
    max_commands: int | None = None,
) -> Decide:
    """What `add_command` decides of the job it locked: a `queue.command` (steer, follow_up or
    abort) for a job that is not terminal. An abort on a queued job also cancels it in the same
    transaction (no worker holds it). With `check_organization`, a job of another organization
    is reported `not_found`. A job already holding `max_commands` commands takes no steer or
    follow_up (`too_many_commands`): its folded state keeps them all; an abort is always
    taken, once: a job that holds one answers `already`, nothing written (each abort was kept
    in the state, so a flood of them grew it, and each write, without bound). One it holds
    under `command_id` (sent again) is `already` too, even once terminal (the abort that
    canceled it); another type under that id `command_id_taken`."""
    if type not in COMMAND_TYPES:
        raise ValueError(f"command type must be one of {COMMAND_TYPES}")
    command = command_id or str(uuid.uuid4())

    def decide(job: Job | None, now: datetime) -> Decision:
        if job is None or (check_organization and job.organization_id != organization_id):
            return Outcome(NOT_FOUND, None)
        if given := next((c for c in job.commands if c.command_id == command), None):
            return Outcome(OK, job, already=True) if given.type == type else COMMAND_ID_TAKEN
        if job.terminal:
            return TERMINAL_STATE
        if type == "abort" and job.abort_requested:
            return Outcome(OK, job, already=True)
        if max_commands is not None and type != "abort" and len(job.commands) >= max_commands:
            return Outcome(TOO_MANY_COMMANDS, job)
        drafts = [command_draft(command, type, payload=payload, reason=reason)]
        if type == "abort" and job.status == "queued":
            # Nothing runs it yet: cancel outright in the same transaction, as singleton
            # cancel does, instead of leaving it queued until some worker honours the abort.
            drafts.append(cancel_queued_draft(job, reason or "abort requested"))
        return drafts

    return decide
