"""The task monitor (`factory-monitor`, kind `factory.task.monitor`): it follows one job of a
live kind — a task's try, or validate or publish — and mirrors it onto its objective's stream,
handing the watch on before its own execution timeout for as long as the job runs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from activities.handlers.context import HandlerContext, HandlerError, objective_of
from receipts.jobs import Job
from receipts.objectives import control
from receipts.objectives.model import ObjectiveState
from receipts.store import Draft
from receipts.tenancy import TENANT_SEPARATOR
from receipts.waits import within

log = logging.getLogger("activities.handlers.monitor")

MONITOR_POLL_S = 0.5
MONITOR_PROGRESS_EVERY_S = 1.0
# A monitor hands the watch on this long before its execution timeout (a quarter of the time
# it had, when that is less).
MONITOR_HANDOFF_MARGIN_S = 30.0


def _last_line(progress: Any) -> str | None:
    if isinstance(progress, dict) and isinstance(progress.get("output"), str):
        lines = [line for line in progress["output"].splitlines() if line.strip()]
        return lines[-1][-500:] if lines else None
    return None


@dataclass(frozen=True)
class _Watched:
    """What a monitor mirrors: one try of a task, or the validate or publish step."""

    job_id: str
    task_id: str | None
    number: Any
    step: str | None

    @classmethod
    def of(cls, payload: Mapping[str, Any]) -> _Watched:
        step = payload.get("step")
        return cls(
            job_id=str(payload.get("jobId")),
            task_id=None if step else str(payload.get("taskId")),
            number=payload.get("try"),
            step=str(step) if step else None,
        )

    def started(self, state: ObjectiveState | None) -> list[Draft]:
        """`objective.task.started` / `objective.step.started`, once the job runs."""
        if state is None:
            return []
        if self.step is not None:
            step = state.step(self.step)
            if step is None or step.status != "dispatched" or step.job_id != self.job_id:
                return []
            return [Draft("objective.step.started", {"step": self.step, "jobId": self.job_id})]
        task = state.task(self.task_id or "")
        if task is None or task.status != "dispatched" or task.current is None:
            return []
        if task.current.number != self.number:
            return []
        return [Draft("objective.task.started", {"taskId": self.task_id, "try": self.number})]

    def progress(self, line: str, lines: int) -> Draft:
        """The job's last output line, mirrored."""
        if self.step is not None:
            data = {"step": self.step, "jobId": self.job_id, "lastLine": line, "lines": lines}
            return Draft("objective.step.progress", data)
        data = {
            "taskId": self.task_id,
            "try": self.number,
            "jobId": self.job_id,
            "lastLine": line,
            "lines": lines,
        }
        return Draft("objective.task.progress", data)


_PART = re.compile(r"^(?P<base>.*):part:(?P<number>[0-9]+)$")


def successor_id(job_id: str) -> str:
    """The job a monitor hands the watch on to: `<id>:part:2` after `<id>`, `<id>:part:<k+1>`
    after `<id>:part:<k>`. It is derived from the monitor's own id alone (never from its
    payload), keeping its organization's tag at the end, so a monitor names no job of another
    organization."""
    head, sep, tag = job_id.partition(TENANT_SEPARATOR)
    match = _PART.match(head)
    base, number = (match["base"], int(match["number"])) if match else (head, 1)
    return f"{base}:part:{number + 1}{sep}{tag}"


async def task_monitor(ctx: HandlerContext) -> dict[str, Any]:
    """Follow one job of a live kind (a task's try, or validate or publish) and mirror it onto
    the objective stream: started when it runs, its last output line (at most once a second)
    and its settlement when it ends.

    A job may run longer than one monitor attempt may (its execution timeout): shortly before
    that timeout the monitor hands the watch on to a successor job, `<monitor id>:part:<k>`,
    created under its attempt's fence, which goes on from the receipts already read, and
    completes. A redelivered monitor whose successor exists ends at once."""
    objective_id = objective_of(ctx)
    watched = _Watched.of(ctx.payload)
    successor = successor_id(ctx.job.job_id)
    if await ctx.receipts.job(successor) is not None:
        return {"objectiveId": objective_id, "jobId": watched.job_id, "handedOffTo": successor}
    after = int(ctx.payload.get("after") or 0)
    started = bool(ctx.payload.get("started"))
    lines = int(ctx.payload.get("lines") or 0)
    last_mirror = 0.0
    pending_line: str | None = None
    loop = asyncio.get_running_loop()
    hand_off_at = None
    if ctx.deadline is not None:
        budget = ctx.deadline - loop.time()
        hand_off_at = ctx.deadline - min(MONITOR_HANDOFF_MARGIN_S, budget / 4)
    while not ctx.aborted.is_set():
        for receipt in await ctx.receipts.job_receipts(watched.job_id, after):
            after = receipt.seq
            if receipt.type == "job.heartbeat" and not started:
                await ctx.receipts.update_objective(objective_id, watched.started)
                started = True
            elif receipt.type == "job.progress":
                data = receipt.data.get("data")
                pending_line = _last_line(data) or pending_line
                if isinstance(data, dict) and isinstance(data.get("lines"), int):
                    lines = data["lines"]
        if pending_line is not None and time.monotonic() - last_mirror >= MONITOR_PROGRESS_EVERY_S:
            await _mirror(ctx, objective_id, watched.progress(pending_line, lines))
            pending_line, last_mirror = None, time.monotonic()
        job = await ctx.receipts.job(watched.job_id)
        if job is None:
            raise HandlerError(f"no job {watched.job_id!r} to monitor", retryable=False)
        if job.terminal and after >= job.seq:
            await _mirror_settlement(ctx, objective_id, job)
            return {"objectiveId": objective_id, "jobId": job.job_id, "jobStatus": job.status}
        if hand_off_at is not None and loop.time() >= hand_off_at:
            if pending_line is not None:
                await _mirror(ctx, objective_id, watched.progress(pending_line, lines))
            carried = {"after": after, "started": started, "lines": lines}
            await ctx.receipts.hand_off(successor, {**ctx.payload, **carried})
            log.info(
                "monitor handed the watch on",
                extra={
                    "event": "factory.monitor_handed_off",
                    "objectiveId": objective_id,
                    "jobId": ctx.job.job_id,
                    "successor": successor,
                },
            )
            return {"objectiveId": objective_id, "jobId": job.job_id, "handedOffTo": successor}
        with contextlib.suppress(TimeoutError):
            await within(ctx.aborted.wait(), MONITOR_POLL_S)
    raise HandlerError("monitor aborted", retryable=False)


async def _mirror_settlement(ctx: HandlerContext, objective_id: str, job: Job) -> None:
    await ctx.receipts.update_objective(
        objective_id, lambda s: control.settlement_drafts(s, {job.job_id: job}) if s else []
    )


async def _mirror(ctx: HandlerContext, objective_id: str, draft: Draft) -> None:
    await ctx.receipts.update_objective(objective_id, lambda s: [draft] if s is not None else [])
