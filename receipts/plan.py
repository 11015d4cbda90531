"""What happens next to a job: the one planning rule of delivery.

The driver starter plans a fresh job's first run with it, the driver's `prepare_delivery`
decides what to do with the job it read, and the lease admits a delivery only when it says the
job is queued, deliverable and waiting for exactly that attempt. Pure: the callers read the job
(and the database clock) and act on the answer.

The dispatcher's rescan (`undelivered_queued` in receipts/sql/delivery.sql) and the redrive's
`redrive_candidates` select, in SQL, the jobs for which `next_step(job, now(), slots=…).step`
is `DELIVER` or `ABORT` — `status = 'queued'`, `available_at` null or reached, and a dispatch
slot free for the job's organization on its worker queue — i.e. `needs_delivery`;
`next_available_at` finds the earliest `NOT_AVAILABLE` one. The jobs projection keeps `status`,
`available_at`, `organization_id` and `worker_queue` as columns for these scans;
tests/integration/test_plan.py checks that the SQL and this function pick the same jobs.

Fair dispatch: an organization may hold at most `cap` dispatch slots per worker
queue (`RECEIPT_ORG_MAX_RUNNING_PER_GROUP`). The starter asks with the slots the job's
organization holds there (`Slots`) when it is about to start a delivery; a job that finds them
all taken is `HELD`: it stays queued, and is started when one is given back (its job settled).
The driver and the lease do not ask: a started delivery keeps its slot until its job settles.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from receipts.jobs import LEASED_STATUSES, Job, lease_expired, stale_lease


class Step(StrEnum):
    """What happens next to a job."""

    MISSING = "missing"  # no such job
    TERMINAL = "terminal"  # settled: nothing moves it any more
    EXPIRED = "expired"  # the database clock passed the lease: append `job.lease_expired`
    STALE = "stale"  # no heartbeat within the stale window: fail it with its own fence
    ACTIVE = "active"  # a live lease: its delivery owns the job until `until`
    ABORT = "abort"  # queued with an abort requested: cancel it (a worker that leases honours it)
    NOT_AVAILABLE = "not_available"  # queued, but not before `until` (`availableAt`)
    HELD = "held"  # queued and deliverable, but its organization holds every slot it may
    DELIVER = "deliver"  # queued and deliverable: attempt `attempt` may lease it


# The steps of a job that a delivery should be started for (the dispatcher's SQL selects these).
NEEDS_DELIVERY: frozenset[Step] = frozenset({Step.DELIVER, Step.ABORT})


@dataclass(frozen=True, slots=True)
class NextStep:
    """`step`, with the attempt a delivery may lease (queued jobs; else 0) and, for a job that
    must be waited for, when to look again."""

    step: Step
    attempt: int = 0
    until: datetime | None = None

    @property
    def needs_delivery(self) -> bool:
        """True when a driver should deliver (or cancel) the job now."""
        return self.step in NEEDS_DELIVERY


@dataclass(frozen=True, slots=True)
class Slots:
    """An organization's share of one worker queue: the dispatch slots its other jobs hold
    there (`held`) and how many it may hold (`cap`; 0: no cap)."""

    held: int
    cap: int

    @property
    def full(self) -> bool:
        """True when the organization may start no further job on that queue."""
        return self.cap > 0 and self.held >= self.cap


def available(job: Job, now: datetime | None) -> bool:
    """True when the job may be delivered: no `availableAt`, or the database clock `now` has
    reached it. Without a clock (`now` None) only a job with no `availableAt` is."""
    if job.available_at is None:
        return True
    return now is not None and job.available_at <= now


def next_step(
    job: Job | None,
    now: datetime | None,
    active_stale_ms: int | None = None,
    slots: Slots | None = None,
) -> NextStep:
    """What happens next to `job` at the database clock `now`.

    Without `now` (a caller that did not read the clock) a lease is never judged expired or
    stale and a job with any `availableAt` is not deliverable: the answer errs towards waiting,
    and whoever acts on it re-checks under the job's row lock. Without `active_stale_ms` a lease
    is never judged stale (only the driver applies the stale window). Without `slots` a job is
    never held back (only the starter, about to start a delivery, shares queues out); with
    them, a deliverable job whose organization's slots are all taken is `HELD`. An abort is
    never held: cancelling a queued job takes no worker.
    """
    if job is None:
        return NextStep(Step.MISSING)
    if job.terminal:
        return NextStep(Step.TERMINAL)
    if job.status in LEASED_STATUSES:
        until = job.lease.expires_at if job.lease is not None else None
        if now is not None and lease_expired(job, now):
            return NextStep(Step.EXPIRED, until=until)
        if now is not None and active_stale_ms is not None:
            if stale_lease(job, now, active_stale_ms):
                return NextStep(Step.STALE, until=until)
        return NextStep(Step.ACTIVE, until=until)
    attempt = job.attempt + 1
    if job.abort_requested:
        return NextStep(Step.ABORT, attempt)
    if not available(job, now):
        return NextStep(Step.NOT_AVAILABLE, attempt, job.available_at)
    if slots is not None and slots.full:
        return NextStep(Step.HELD, attempt)
    return NextStep(Step.DELIVER, attempt)
