"""Objective control: a reconciler safe to run any number of times, from any state.

`plan` is pure: from the folded objective and the jobs of its active tries it decides what one
pass does — record settlements, abort jobs, dispatch ready tasks, run validate then publish,
settle the objective. `reconcile` runs passes until one finds nothing to do. Every write is
idempotent: job ids are deterministic (a repeated dispatch returns the existing job) and each
objective receipt is re-decided under the stream's lock against the current state.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from receipts import metrics
from receipts import operations as ops
from receipts.enqueue import EnqueueRequest, enqueue_in
from receipts.jobs import Job
from receipts.kinds import CONTRACTS
from receipts.objectives import store as objectives
from receipts.objectives.model import (
    STEPS,
    TASK_ACTIVE,
    ObjectiveState,
    StepState,
    TaskState,
    audit_job_id,
    monitor_job_id,
    step_job_id,
    step_monitor_job_id,
    task_job_id,
)
from receipts.store import Draft, Store, Tx

log = logging.getLogger("receipts.objectives.control")

TASK_KIND = "factory.task.run"
MONITOR_KIND = "factory.task.monitor"
AUDIT_KIND = "factory.objective.audit"
STEP_KINDS = {"validate": "factory.integration.validate", "publish": "factory.integration.publish"}
TASK_JOB_ATTEMPTS = 2  # deliveries lost to a dead worker; the task's own budget counts tries
MAX_PASSES = 50


@dataclass(frozen=True)
class Plan:
    """What one control pass does, in this order."""

    records: tuple[Draft, ...] = ()
    aborts: tuple[tuple[str, str], ...] = ()
    dispatch: tuple[TaskState, ...] = ()
    step: str | None = None
    settle: dict[str, Any] | None = None

    @property
    def empty(self) -> bool:
        """True when the pass has nothing to do."""
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
            drafts.append(
                Draft(
                    "objective.step.settled",
                    {
                        "step": name,
                        "jobId": job.job_id,
                        "status": job.status,
                        "error": job.error or job.canceled_reason,
                    },
                )
            )
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


def task_payload(state: ObjectiveState, task: TaskState, number: int) -> dict[str, Any]:
    """The `factory.task.run` payload of one try."""
    payload: dict[str, Any] = {
        "kind": TASK_KIND,
        "objectiveId": state.objective_id,
        "taskId": task.task_id,
        "try": number,
        "executionPath": task.execution_path,
        "authContext": state.auth_context,
        "input": task.input,
    }
    if task.timeout_ms is not None:
        payload["timeoutMs"] = task.timeout_ms
    return payload


def _request(
    state: ObjectiveState, agent_id: str, kind: str, job_id: str, payload: dict[str, Any]
) -> EnqueueRequest:
    return EnqueueRequest(
        agent_id=agent_id,
        payload=payload,
        kind=kind,
        organization_id=state.organization_id,
        job_id=job_id,
        max_attempts=TASK_JOB_ATTEMPTS,
        traceparent=state.traceparent,
    )


async def _watch_live(
    tx: Tx, state: ObjectiveState, kind: str, job_id: str, monitor_id: str, **what: Any
) -> None:
    """The contract's live-execution flag: a job of a live kind is watched while it runs by a
    `factory.task.monitor` job beside it, enqueued in the transaction that dispatches it, which
    mirrors its start, output and settlement onto the objective (`what`: its task and try, or
    its step)."""
    if not CONTRACTS[kind].live_execution:
        return
    payload = {
        "kind": MONITOR_KIND,
        "objectiveId": state.objective_id,
        "jobId": job_id,
        "authContext": state.auth_context,
        **what,
    }
    await enqueue_in(tx, _request(state, "factory-monitor", MONITOR_KIND, monitor_id, payload))


async def _dispatch_task(
    store: Store, state: ObjectiveState, task: TaskState, guard: objectives.Guard | None
) -> None:
    number = len(task.tries) + 1
    job_id = task_job_id(state.objective_id, task.task_id, number)
    async with store.transaction() as tx:
        await enqueue_in(
            tx,
            _request(state, task.agent_id, TASK_KIND, job_id, task_payload(state, task, number)),
        )
        await _watch_live(
            tx,
            state,
            TASK_KIND,
            job_id,
            monitor_job_id(state.objective_id, task.task_id, number),
            taskId=task.task_id,
            executionPath=task.execution_path,
            **{"try": number},
        )

        def decide(current: ObjectiveState | None) -> list[Draft]:
            if current is None or current.terminal or current.cancel_requested:
                return []  # settled or being cancelled since the pass read it
            now = current.task(task.task_id)
            if now is None or now.status != "pending" or len(now.tries) + 1 != number:
                return []
            if now.phase != current.phase:
                return []  # superseded since the pass read it
            data = {"taskId": task.task_id, "try": number, "jobId": job_id}
            return [Draft("objective.task.dispatched", data)]

        await _recorded(tx, state.objective_id, decide, guard)
    metrics.FACTORY_TASKS_DISPATCHED.inc()
    log.info(
        "task dispatched",
        extra={
            "event": "factory.task_dispatched",
            "objectiveId": state.objective_id,
            "taskId": task.task_id,
            "try": number,
            "jobId": job_id,
        },
    )


async def _dispatch_step(
    store: Store, state: ObjectiveState, name: str, guard: objectives.Guard | None
) -> None:
    step = state.step(name)
    assert isinstance(step, StepState)
    job_id = step_job_id(state.objective_id, name, state.phase)
    payload = {
        "kind": STEP_KINDS[name],
        "objectiveId": state.objective_id,
        "step": name,
        "authContext": state.auth_context,
        "input": {"command": list(step.command)},
    }
    async with store.transaction() as tx:
        await enqueue_in(tx, _request(state, "codex", STEP_KINDS[name], job_id, payload))
        await _watch_live(
            tx,
            state,
            STEP_KINDS[name],
            job_id,
            step_monitor_job_id(state.objective_id, name, state.phase),
            step=name,
        )

        def decide(current: ObjectiveState | None) -> list[Draft]:
            now = current.step(name) if current else None
            if current is None or now is None or now.status != "pending":
                return []
            if plan(current, {}).step != name:  # a step no longer due (a phase added)
                return []
            data = {"step": name, "jobId": job_id, "phase": current.phase}
            return [Draft("objective.step.dispatched", data)]

        await _recorded(tx, state.objective_id, decide, guard)


class _Moved(Exception):
    """The objective moved on since the pass read it: what the pass enqueued is rolled back."""


async def _recorded(
    tx: Tx, objective_id: str, decide: objectives.Decide, guard: objectives.Guard | None
) -> None:
    """Record what `decide` chooses under the objective's lock; when it chooses nothing (the
    objective moved on since the pass read it: a new phase, another pass), roll back the whole
    transaction, so no job is left running for a task or step the objective no longer owes."""
    _, written = await objectives.update(tx, objective_id, decide, guard)
    if not written:
        raise _Moved(objective_id)


async def _settle(
    store: Store,
    state: ObjectiveState,
    settle: dict[str, Any],
    kind: str,
    guard: objectives.Guard | None,
    jobs: Mapping[str, Job],
) -> None:
    async with store.transaction() as tx:
        audit = None
        if CONTRACTS[kind].terminal_objective_audit:
            # The contract's terminal-audit flag: settling the objective requests its audit.
            audit = audit_job_id(state.objective_id)
            await enqueue_in(
                tx,
                EnqueueRequest(
                    agent_id="factory-control",
                    payload={
                        "kind": AUDIT_KIND,
                        "objectiveId": state.objective_id,
                        "authContext": state.auth_context,
                    },
                    kind=AUDIT_KIND,
                    organization_id=state.organization_id,
                    job_id=audit,
                    max_attempts=3,
                    traceparent=state.traceparent,
                ),
            )

        def decide(current: ObjectiveState | None) -> list[Draft]:
            # Re-decided on the objective as it is now: a phase added (or anything else that
            # changes the decision) since the pass read it leaves it to the next pass.
            if current is None or plan(current, jobs).settle != settle:
                return []
            drafts = [Draft("objective.settled", settle)]
            if audit:
                drafts.append(Draft("objective.audit_requested", {"auditJobId": audit}))
            return drafts

        await _recorded(tx, state.objective_id, decide, guard)
    metrics.FACTORY_OBJECTIVES_SETTLED.labels(settle["status"]).inc()
    log.info(
        "objective settled",
        extra={
            "event": "factory.objective_settled",
            "objectiveId": state.objective_id,
            "status": settle["status"],
            "error": settle.get("error"),
        },
    )


async def run_pass(
    store: Store, objective_id: str, kind: str, guard: objectives.Guard | None = None
) -> tuple[ObjectiveState | None, Plan]:
    """Read the objective and its jobs, plan one pass and carry it out. Returns the state the
    pass was planned on and the plan. `guard` runs in every transaction that writes the
    objective (`objectives.update`)."""
    state = await objectives.get(store, objective_id)
    if state is None:
        return None, Plan()
    jobs = await objectives.jobs_by_ids(store, state.active_job_ids())
    decided = plan(state, jobs)
    if decided.records:

        def decide(current: ObjectiveState | None) -> list[Draft]:
            # Re-decided under the stream's lock: the monitor may have recorded some already.
            return settlement_drafts(current, jobs) if current is not None else []

        async with store.transaction() as tx:
            await objectives.update(tx, objective_id, decide, guard)
    for job_id, reason in decided.aborts:
        await ops.add_command(store, job_id, type="abort", reason=reason, check_organization=False)
    try:
        for task in decided.dispatch:
            await _dispatch_task(store, state, task, guard)
        if decided.step:
            await _dispatch_step(store, state, decided.step, guard)
        if decided.settle:
            await _settle(store, state, decided.settle, kind, guard, jobs)
    except _Moved:
        # Nothing of this write stands; the next pass plans on the objective as it is now.
        metrics.FACTORY_CONTROL_STALE_PLANS.inc()
        log.info(
            "the objective moved on while a control pass wrote; planning again",
            extra={"event": "factory.control_plan_stale", "objectiveId": objective_id},
        )
    return state, decided


def _covered_through(observed: int) -> objectives.Decide:
    """Record that a pass which found nothing to do covered every request up to `observed`."""

    def decide(current: ObjectiveState | None) -> list[Draft]:
        if current is None or current.reconciled_seq >= observed:
            return []
        if current.control_requested_seq <= current.reconciled_seq:
            return []
        return [Draft("objective.reconciled", {"throughSeq": observed})]

    return decide


@dataclass
class ReconcileResult:
    """What a control job's passes did."""

    passes: int = 0
    dispatched: list[str] = field(default_factory=list)
    recorded: int = 0
    aborted: list[str] = field(default_factory=list)
    settled: str | None = None
    steps: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The control job's result."""
        return {
            "passes": self.passes,
            "dispatched": self.dispatched,
            "recorded": self.recorded,
            "aborted": self.aborted,
            "steps": self.steps,
            "settled": self.settled,
        }


async def reconcile(
    store: Store,
    objective_id: str,
    kind: str = "factory.objective.control",
    guard: objectives.Guard | None = None,
) -> ReconcileResult:
    """Run passes until one finds nothing to do, then record `objective.reconciled` through the
    seq that quiet pass observed: every control request up to it is covered. `guard` runs in
    every transaction that writes the objective."""
    result = ReconcileResult()
    for _ in range(MAX_PASSES):
        state, decided = await run_pass(store, objective_id, kind, guard)
        result.passes += 1
        if state is None:
            return result
        result.recorded += len(decided.records)
        result.aborted += [job_id for job_id, _ in decided.aborts]
        result.dispatched += [t.task_id for t in decided.dispatch]
        if decided.step:
            result.steps.append(decided.step)
        if decided.settle:
            result.settled = decided.settle["status"]
        if decided.empty:
            async with store.transaction() as tx:
                await objectives.update(tx, objective_id, _covered_through(state.seq), guard)
            return result
    log.warning(
        "control passes did not settle down; the outbox will run another job",
        extra={"event": "factory.control_passes_exhausted", "objectiveId": objective_id},
    )
    return result
