"""Objective control's decision, pure: from the folded objective and the jobs of its active
tries, what one pass does — record settlements, abort jobs, dispatch ready tasks, run validate
then publish, settle the objective. `receipts/objectives/control.py` carries a pass out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from receipts.jobs import Job
from receipts.objectives.model import STEPS, TASK_ACTIVE, ObjectiveState, TaskState
from receipts.store import Draft


@dataclass(frozen=True)
class Plan:
    """What one control pass does, in this order."""

    records: tuple[Draft, ...] = ()
    aborts: tuple[tuple[str, str], ...] = ()
    dispatch: tuple[TaskState, ...] = ()
    step: str | None = None
    settle: dict[str, Any] | None = None
    # Set by the pass that carries the plan out (control.run_pass), never by `plan`: ready
    # tasks left pending because the organization holds its caps of open jobs.
    held: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        """True when the pass has nothing to do (held tasks are nothing it can do)."""
        return not (self.records or self.aborts or self.dispatch or self.step or self.settle)


def settlement_drafts(state: ObjectiveState, jobs: Mapping[str, Job]) -> list[Draft]:
    """Settlement receipts for tries and steps whose job is terminal but not yet recorded."""
    drafts: list[Draft] = []
    for task in state.tasks:
        job = jobs.get(task.job_id or "")
        if task.status in TASK_ACTIVE and task.current is not None and job and job.terminal:
            drafts.append(
                Draft(
                    "objective.task.settled",
                    {
                        "taskId": task.task_id,
                        "try": task.current.number,
                        "jobId": job.job_id,
                        "status": job.status,
                        "error": job.error or job.canceled_reason,
                        "jobAttempts": job.attempt,
                    },
                )
            )
    for name in STEPS:
        step = state.step(name)
        job = jobs.get(step.job_id or "") if step else None
        if step is not None and step.status in TASK_ACTIVE and job and job.terminal:
            data: dict[str, Any] = {
                "step": name,
                "jobId": job.job_id,
                "status": job.status,
                "error": job.error or job.canceled_reason,
            }
            if job.status != "completed" and step.phase is not None and step.phase < state.phase:
                # It ran for an earlier phase (one added meanwhile, a fix perhaps): its failure
                # fails no phase; it is due again after the new one, as a completed run is.
                data["again"] = True
            drafts.append(Draft("objective.step.settled", data))
    return drafts


def _active_jobs(state: ObjectiveState, jobs: Mapping[str, Job]) -> list[Job]:
    return [
        job for job_id in state.active_job_ids() if (job := jobs.get(job_id)) and not job.terminal
    ]


def _aborts(active: Sequence[Job], reason: str) -> tuple[tuple[str, str], ...]:
    return tuple((job.job_id, reason) for job in active if not job.abort_requested)


def ready(state: ObjectiveState) -> tuple[TaskState, ...]:
    """Pending tasks of the current phase whose dependencies all completed."""
    done = {t.task_id for t in state.tasks if t.status == "completed"}
    return tuple(
        t for t in state.phase_tasks if t.status == "pending" and set(t.depends_on) <= done
    )


def plan(state: ObjectiveState, jobs: Mapping[str, Job]) -> Plan:
    """Decide one pass from the objective and the jobs of its active tries (pure)."""
    if state.terminal:
        return Plan()
    records = settlement_drafts(state, jobs)
    if records:
        return Plan(records=tuple(records))
    active = _active_jobs(state, jobs)
    if state.cancel_requested:
        if active:
            return Plan(aborts=_aborts(active, "objective canceled"))
        reason = state.cancel_reason or "canceled"
        return Plan(settle={"status": "canceled", "error": reason})
    # A task of the phase failed out of its budget, or its job was canceled from outside (an
    # abort posted to it): the objective cannot complete. Its other jobs are aborted, and it
    # settles `failed` once none runs, so every task is terminal (and recorded) when it does.
    # The failed task is the cause; canceled ones may be siblings its failure aborted.
    stopped = next((t for t in state.phase_tasks if t.status == "failed"), None) or next(
        (t for t in state.phase_tasks if t.status == "canceled"), None
    )
    if stopped is not None:
        if active:
            return Plan(aborts=_aborts(active, f"task {stopped.task_id} {stopped.status}"))
        tries = len(stopped.tries)
        ended = (
            f"failed after {tries} {'try' if tries == 1 else 'tries'}"
            if stopped.status == "failed"
            else "was canceled"
        )
        return Plan(
            settle={
                "status": "failed",
                "error": f"task {stopped.task_id!r} {ended}: {stopped.error}",
                "failedTask": stopped.task_id,
            },
        )
    for name in STEPS:
        step = state.step(name)
        if step is not None and step.status in ("failed", "canceled"):
            return Plan(
                settle={
                    "status": "failed",
                    "error": f"{name} step {step.status}: {step.error}",
                    "failedStep": name,
                }
            )
    # Superseded phases: a try whose job has not started is canceled; running ones finish.
    superseded = tuple(
        (job.job_id, "superseded by a new phase")
        for task in state.tasks
        if task.phase < state.phase and task.status in TASK_ACTIVE
        if (job := jobs.get(task.job_id or "")) and job.status == "queued"
        if not job.abort_requested
    )
    # A step still running (a phase added meanwhile) ends before the new phase's tasks run in
    # its workspace; its end makes it due again (it covered the earlier phases only).
    if any((step := state.step(name)) and step.status in TASK_ACTIVE for name in STEPS):
        return Plan(aborts=superseded)
    to_dispatch = ready(state)
    if superseded or to_dispatch:
        return Plan(aborts=superseded, dispatch=to_dispatch)
    phase_done = all(t.status == "completed" for t in state.phase_tasks)
    older_running = any(t.status in TASK_ACTIVE for t in state.tasks if t.phase < state.phase)
    if not phase_done or older_running:
        return Plan()
    for name in STEPS:
        step = state.step(name)
        if step is None or step.status == "completed":
            continue
        return Plan(step=name) if step.status == "pending" else Plan()
    return Plan(settle={"status": "completed"})
