"""Typed inputs and results passed between workflows and activities (pure dataclasses).

No `from __future__ import annotations` here: Temporal's converter resolves a dataclass's type
hints at every decode, and string annotations made that about twice as slow (the driver decodes
a `DriverInput` and an `AttemptResult` per job, the worker an `AttemptInput`). So a class is
defined before the classes that name it.
"""

from dataclasses import dataclass, field
from enum import StrEnum


class AttemptStatus(StrEnum):
    """How an attempt ended (`AttemptResult.status`): `completed`, or one of the spec's seven
    statuses of an attempt that did not complete. Recorded in workflow histories: never rename
    a value."""

    COMPLETED = "completed"
    SETTLEMENT_CONFLICT = "settlement_conflict"
    STALE_ATTEMPT = "stale_attempt"
    LEASE_LOST = "lease_lost"
    TERMINAL_STATE = "terminal_state"
    CANCELED = "canceled"
    EXECUTION_TIMEOUT = "execution_timeout"
    FAILED = "failed"


COMPLETED = AttemptStatus.COMPLETED
ATTEMPT_STATUSES: tuple[str, ...] = tuple(s.value for s in AttemptStatus if s is not COMPLETED)


class DriverAction(StrEnum):
    """What the driver does after reading the job (`DriverPlan.action`).

    The values are recorded in workflow histories (the plan is a local activity's result):
    never rename one.
    """

    DISPATCH = "dispatch"  # deliver attempt `DriverPlan.attempt`
    STALE_FAILED = "stale_failed"  # a stale or expired lease was ended; read again
    ABORTED = "aborted"  # an abort on a queued job canceled it
    TERMINAL = "terminal"  # already settled: post the terminal callback, stop
    ACTIVE = "active"  # a live lease: wait until it may have expired
    NOT_AVAILABLE = "not_available"  # queued with a future `availableAt`: wait for it
    MISSING = "missing"  # no such job


@dataclass
class DriverPlan:
    """The driver's read of the job (activity `prepare_delivery`): what to do next."""

    action: DriverAction
    job_status: str = ""
    attempt: int = 0
    task_queue: str = ""
    agent_id: str = ""
    lane: str = ""
    kind: str = ""
    lease_ms: int = 0
    execution_timeout_ms: int = 0
    heartbeat_ms: int = 0
    driver_timeout_ms: int = 0
    wait_ms: int = 0
    error: str | None = None
    # Temporal's heartbeat timeout of the attempt activity (RECEIPT_WORKER_LOST_TIMEOUT_MS);
    # 0 in plans recorded before it existed.
    worker_lost_timeout_ms: int = 0


@dataclass
class DriverInput:
    """Start of one delivery generation of a job."""

    job_id: str
    generation: int = 0
    callbacks: bool = False
    dispatched_posted: bool = False
    deliveries: int = 2
    # Set by every starter: `dispatched` is posted beside the attempt, not before it (a slow
    # receiver no longer holds the job's start); the terminal callback and a continue-as-new
    # wait for it. Runs recorded without it keep the order of their history.
    dispatched_beside: bool = False
    # The starter's own read of a job it found queued and deliverable, so the first run need
    # not read it again; cleared before every continue-as-new (later runs always re-read).
    plan: DriverPlan | None = None


@dataclass
class AttemptInput:
    """One attempt of a job, as the driver hands it to the `execute_attempt` activity."""

    job_id: str
    attempt: int
    agent_id: str
    kind: str
    lane: str
    lease_ms: int
    execution_timeout_ms: int
    heartbeat_ms: int
    deliveries: int = 2


@dataclass
class AttemptResult:
    """What an attempt ended with: `completed` or one of `ATTEMPT_STATUSES`."""

    status: str
    job_status: str = ""
    retryable: bool = False
    error: str | None = None
    worker_id: str | None = None
    detail: dict[str, str] = field(default_factory=dict)


@dataclass
class CallbackRequest:
    """Post the job's `event` callback to every configured URL (once per URL)."""

    job_id: str
    event: str
