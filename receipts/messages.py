"""Typed inputs and results passed between workflows and activities (pure dataclasses)."""

from __future__ import annotations

from dataclasses import dataclass, field

# Result statuses of an attempt that did not complete (the spec's seven), plus `completed`.
COMPLETED = "completed"
ATTEMPT_STATUSES: tuple[str, ...] = (
    "settlement_conflict",
    "stale_attempt",
    "lease_lost",
    "terminal_state",
    "canceled",
    "execution_timeout",
    "failed",
)

# What the driver found when it read the job.
DISPATCH = "dispatch"
STALE_FAILED = "stale_failed"
ABORTED = "aborted"
TERMINAL = "terminal"
ACTIVE = "active"
NOT_AVAILABLE = "not_available"
MISSING = "missing"


@dataclass
class DriverInput:
    """Start of one delivery generation of a job."""

    job_id: str
    generation: int = 0
    callbacks: bool = False
    dispatched_posted: bool = False
    deliveries: int = 2
    # The starter's own read of a job it found queued and deliverable, so the first run need
    # not read it again; cleared before every continue-as-new (later runs always re-read).
    plan: DriverPlan | None = None


@dataclass
class DriverPlan:
    """The driver's read of the job (activity `prepare_delivery`): what to do next."""

    action: str
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


@dataclass
class AttemptInput:
    """One attempt of a job, as the driver hands it to `JobAttemptWorkflow`."""

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
