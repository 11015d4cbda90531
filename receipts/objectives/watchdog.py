"""The objective watchdog's decision (pure): which reconcile reason, if any, an objective fires."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from receipts import jobs as jobmodel
from receipts.jobs import Job
from receipts.objectives.model import TASK_ACTIVE, ObjectiveState
from receipts.watchdog import SANDBOX_STALE_MS

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
        if job.status == "queued" or jobmodel.stale_lease(job, now, thresholds.active_stale_ms):
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
