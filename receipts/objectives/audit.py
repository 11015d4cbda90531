"""The objective audit (pure): tasks, tries, durations, failures and the job behind each."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from receipts.jobs import Job
from receipts.objectives.model import STEPS, ObjectiveState, step_job_id


def _ms(start: datetime | None, end: datetime | None) -> int | None:
    if start is None or end is None:
        return None
    return int((end - start).total_seconds() * 1000)


def _job_line(job: Job | None) -> dict[str, Any]:
    if job is None:
        return {"jobStatus": None}
    return {
        "jobStatus": job.status,
        "jobAttempts": job.attempt,
        "durationMs": _ms(job.created_at, job.settled_at),
        "error": job.error or job.canceled_reason,
    }


def summary(state: ObjectiveState, jobs: Mapping[str, Job]) -> dict[str, Any]:
    """The `objective.audited` summary: one entry per task (each try with its job), the steps,
    the failures, and totals."""
    tasks: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    for task in state.tasks:
        tries = []
        for attempt in task.tries:
            line: dict[str, Any] = {
                "try": attempt.number,
                "jobId": attempt.job_id,
                "status": attempt.status,
            }
            line.update(_job_line(jobs.get(attempt.job_id)))
            if attempt.started_at and attempt.settled_at:
                line["runMs"] = _ms(attempt.started_at, attempt.settled_at)
            tries.append(line)
            if attempt.status == "failed":
                failures.append(
                    {
                        "taskId": task.task_id,
                        "try": attempt.number,
                        "jobId": attempt.job_id,
                        "error": line.get("error") or attempt.error,
                    }
                )
        durations = [t["durationMs"] for t in tries if t.get("durationMs") is not None]
        tasks.append(
            {
                "taskId": task.task_id,
                "title": task.title,
                "phase": task.phase,
                "status": task.status,
                "tries": tries,
                "attempts": len(tries),
                "durationMs": sum(durations) if durations else None,
            }
        )
    steps = []
    for name in STEPS:
        step = state.step(name)
        if step is None:
            continue
        line = {"step": name, "status": step.status, "jobId": step.job_id}
        line.update(_job_line(jobs.get(step.job_id or "")))
        # Every run of it, one per phase it ran for: a phase added after a validate or publish
        # ran makes it run again, and the fold keeps the last run only (a publish of phase 1
        # did its work all the same).
        line["runs"] = [
            {"phase": phase, "jobId": job_id, **_job_line(job)}
            for phase, job_id in _step_runs(state, name)
            if (job := jobs.get(job_id)) is not None
        ]
        steps.append(line)
        if step.status == "failed":
            failures.append({"step": name, "jobId": step.job_id, "error": line.get("error")})
    return {
        "objectiveId": state.objective_id,
        "status": state.status,
        "error": state.error,
        "phase": state.phase,
        "tasks": tasks,
        "steps": steps,
        "failures": failures,
        "totals": {
            "tasks": len(tasks),
            "completed": sum(1 for t in tasks if t["status"] == "completed"),
            "failed": sum(1 for t in tasks if t["status"] == "failed"),
            "canceled": sum(1 for t in tasks if t["status"] == "canceled"),
            "tries": sum(t["attempts"] for t in tasks),
            "durationMs": _ms(state.created_at, state.settled_at),
        },
    }


def _step_runs(state: ObjectiveState, name: str) -> list[tuple[int, str]]:
    """(phase, job id) of each run the step may have had: its job ids name their phase."""
    return [
        (phase, step_job_id(state.objective_id, name, phase)) for phase in range(1, state.phase + 1)
    ]


def job_ids(state: ObjectiveState) -> list[str]:
    """Every job the objective dispatched that its fold names (each try, each step's last run)."""
    ids = [attempt.job_id for task in state.tasks for attempt in task.tries]
    ids += [s.job_id for name in STEPS if (s := state.step(name)) and s.job_id]
    return ids


def jobs_to_read(state: ObjectiveState) -> list[str]:
    """The jobs a summary reads: `job_ids`, and the job id each step would have had in every
    phase (those that exist are its earlier runs; the fold keeps the last one only)."""
    ids = job_ids(state)
    ids += [
        job_id
        for name in STEPS
        if state.step(name) is not None
        for _, job_id in _step_runs(state, name)
        if job_id not in ids
    ]
    return ids
