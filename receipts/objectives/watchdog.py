"""The Factory objective watchdog: its settings, names and bounds, and its decision (pure):
which reconcile reason, if any, an objective fires. Its Temporal Schedule is kept by
roles/delivery/watchdog_schedule.py, its tick is workflows/watchdog_tick.py with
activities/watchdog_tick.py, and the scan that acts on the decision is the
`factory.objective.watchdog` handler (activities/handlers/factory.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, ClassVar

from pydantic import AfterValidator, Field

from receipts import jobs as jobmodel
from receipts.jobs import Job
from receipts.objectives.model import TASK_ACTIVE, ObjectiveState
from receipts.settings import ReceiptSettings, Switch, Whole

DEFAULT_CRON = "* * * * *"
TIMEOUT_DEFAULT_MS, TIMEOUT_FLOOR_MS = 60_000, 10_000
SCAN_LIMIT_DEFAULT, SCAN_LIMIT_MIN, SCAN_LIMIT_MAX = 200, 1, 2_000
REASONS: tuple[str, ...] = (
    "no_active_objective_work",
    "phase_supersession_has_active_stale_job",
    "active_objective_work_stalled",
)
WATCHDOG_KIND = "factory.objective.watchdog"
WATCHDOG_AGENT = "factory-control"
# Sandboxed execution is treated as stale only after 15 minutes (a computer-backed task can be
# quiet while its workspace syncs).
SANDBOX_STALE_MS = 15 * 60 * 1000


def watchdog_job_id(scheduled_time_iso: str) -> str:
    """`watchdog:<scheduledTime>`: one job per schedule tick, so a retried tick adds nothing."""
    return f"watchdog:{scheduled_time_iso}"


def tick_of(job_id: str) -> int:
    """Which window of the active objectives a watchdog job reads (`objectives.active`): a hash
    of its id (`watchdog:<scheduledTime>`), so a retried tick reads the same one and, whatever
    the cron, every window is read over the ticks (the schedule's minute modulo the number of
    windows left windows unread for ever under a cron of every k minutes)."""
    return int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:8], "big")


def _floored(value: int) -> int:
    return max(TIMEOUT_FLOOR_MS, value)


def _clamped(value: int) -> int:
    return max(SCAN_LIMIT_MIN, min(SCAN_LIMIT_MAX, value))


class WatchdogSettings(ReceiptSettings):
    """The Factory objective watchdog's schedule and scan: the timeout floored at 10 000, the
    scan limit clamped to 1..2000."""

    accepts: ClassVar[dict[str, str]] = {
        "timeout_ms": "an integer (milliseconds)",
        "scan_limit": "an integer",
    }

    enabled: Switch = Field(default=True, alias="RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_ENABLED")
    cron: Annotated[str, AfterValidator(lambda v: v.strip() or DEFAULT_CRON)] = Field(
        default=DEFAULT_CRON, alias="RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_CRON"
    )
    timeout_ms: Annotated[Whole, AfterValidator(_floored)] = Field(
        default=TIMEOUT_DEFAULT_MS, alias="RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_TIMEOUT_MS"
    )
    scan_limit: Annotated[Whole, AfterValidator(_clamped)] = Field(
        default=SCAN_LIMIT_DEFAULT, alias="RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_SCAN_LIMIT"
    )


NO_ACTIVE_WORK = "no_active_objective_work"
SUPERSEDED_STALE = "phase_supersession_has_active_stale_job"
STALLED = "active_objective_work_stalled"
# An objective whose work just settled is owed a control pass by the outbox within seconds;
# only one left without work for longer than this is the watchdog's business.
NO_WORK_GRACE_MS = 30_000


@dataclass(frozen=True)
class Thresholds:
    """How long work may be quiet: local tasks `active_stale_ms`, computer tasks 15 minutes."""

    active_stale_ms: int = 600_000
    computer_stale_ms: int = SANDBOX_STALE_MS
    no_work_grace_ms: int = NO_WORK_GRACE_MS


def reason(
    state: ObjectiveState,
    jobs: Mapping[str, Job],
    control_active: bool,
    now: datetime,
    thresholds: Thresholds,
) -> str | None:
    """The reason this active objective needs a reconcile, or None.

    - `phase_supersession_has_active_stale_job`: a try of a superseded phase is still active
      and has not started (it should have been canceled) or its lease went stale;
    - `no_active_objective_work`: no task, step or control job is active, and the objective has
      been quiet past the grace period;
    - `active_objective_work_stalled`: work is active but neither the objective nor its jobs
      changed for the stale threshold (15 minutes when a `computer` task is active).
    """
    if state.terminal:
        return None
    active = [job for job_id in state.active_job_ids() if (job := jobs.get(job_id))]
    active = [job for job in active if not job.terminal]
    for task in state.tasks:
        if task.phase >= state.phase or task.status not in TASK_ACTIVE:
            continue
        job = jobs.get(task.job_id or "")
        if job is None or job.terminal:
            continue
        # The spec: sandboxed execution is stale only after 15 minutes, superseded or not.
        stale_ms = (
            thresholds.computer_stale_ms
            if task.execution_path == "computer"
            else thresholds.active_stale_ms
        )
        if job.status == "queued" or jobmodel.stale_lease(job, now, stale_ms):
            return SUPERSEDED_STALE
    quiet_since = max([state.updated_at, *(job.updated_at for job in active)])
    quiet = now - quiet_since
    if not active and not control_active:
        if quiet > timedelta(milliseconds=thresholds.no_work_grace_ms):
            return NO_ACTIVE_WORK
        return None
    computer = any(t.execution_path == "computer" for t in state.tasks if t.status in TASK_ACTIVE)
    limit = thresholds.computer_stale_ms if computer else thresholds.active_stale_ms
    if active and quiet > timedelta(milliseconds=limit):
        return STALLED
    return None
