"""Objective control: a reconciler safe to run any number of times, from any state.

`plan` (receipts/objectives/decide.py) is pure: from the folded objective and the jobs of its
active tries it decides what one pass does. `run_pass` carries one out; `reconcile` runs passes
until one finds nothing to do. Every write is idempotent: job ids are deterministic (a repeated
dispatch returns the existing job) and each objective receipt is re-decided under the stream's
lock against the current state. A task's dispatch is held, as an enqueue would be refused,
while the organization holds its caps of open jobs (`OrgCaps`): it stays pending, and a later
pass dispatches it (one of the objective's jobs ending, or the watchdog's pass when none is
left).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from receipts import operations as ops
from receipts.enqueue import EnqueueRequest, OrgCaps, enqueue_in
from receipts.jobs import Job
from receipts.kinds import CONTRACTS
from receipts.objectives import metrics as factory_metrics
from receipts.objectives import store as objectives
from receipts.objectives.decide import Plan, plan, settlement_drafts
from receipts.objectives.model import (
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


def task_payload(
    state: ObjectiveState, task: TaskState, number: int, max_timeout_ms: int | None = None
) -> dict[str, Any]:
    """The `factory.task.run` payload of one try; its `timeoutMs` at most `max_timeout_ms`."""
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
        payload["timeoutMs"] = min(task.timeout_ms, max_timeout_ms or task.timeout_ms)
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


class _Held(Exception):
    """The organization holds its caps of open jobs: a task's dispatch waits for room."""


async def _hold(tx: Tx, state: ObjectiveState, caps: OrgCaps | None) -> None:
    """Raise `_Held` unless the organization's open jobs leave room for a task's try and its
    monitor (read from its counters, as an enqueue's caps are: dispatches of one organization
    committing at the same moment may pass a cap by at most their number). The control job
    running the pass is not counted, and an organization with no other open job always gets
    one dispatch: caps too small for a try and its monitor hold the objective back, never for
    ever."""
    if caps is None or state.organization_id is None:
        return
    row = await tx.fetch_one("enqueue_caps", {"organization_id": state.organization_id})
    assert row is not None
    queued, active = int(row[1]), max(int(row[2]) - 1, 0)  # less the control job's own place
    need = 2 if CONTRACTS[TASK_KIND].live_execution else 1
    if caps.room(queued, active) < need and active > 0:
        raise _Held(queued, active)


async def _dispatch_task(
    store: Store,
    state: ObjectiveState,
    task: TaskState,
    guard: objectives.Guard | None,
    caps: OrgCaps | None,
) -> None:
    number = len(task.tries) + 1
    job_id = task_job_id(state.objective_id, task.task_id, number)
    async with store.transaction() as tx:
        await objectives.lock_objective(tx, state.objective_id, guard)  # lock order: jobs last
        await _hold(tx, state, caps)
        payload = task_payload(state, task, number, caps.max_timeout_ms if caps else None)
        await enqueue_in(tx, _request(state, task.agent_id, TASK_KIND, job_id, payload))
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
    factory_metrics.FACTORY_TASKS_DISPATCHED.inc()
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
        await objectives.lock_objective(tx, state.objective_id, guard)  # lock order: jobs last
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
            if current.phase != state.phase:  # its job id names the phase the pass read
                return []
            if plan(current, {}).step != name:  # a step no longer due (a phase added)
                return []
            data = {"step": name, "jobId": job_id, "phase": current.phase}
            return [Draft("objective.step.dispatched", data)]

        await _recorded(tx, state.objective_id, decide, guard)
    factory_metrics.FACTORY_STEPS_DISPATCHED.labels(name).inc()
    log.info(
        "step dispatched",
        extra={
            "event": "factory.step_dispatched",
            "objectiveId": state.objective_id,
            "step": name,
            "phase": state.phase,
            "jobId": job_id,
        },
    )


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
    read_active = set(state.active_job_ids())
    async with store.transaction() as tx:
        await objectives.lock_objective(tx, state.objective_id, guard)  # lock order: jobs last
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
            # changes the decision) since the pass read it leaves it to the next pass. A try or
            # step dispatched since then (by another pass) has no job in `jobs`, so `plan` would
            # not see it running: the objective would settle and leave that job running.
            if current is None or not set(current.active_job_ids()) <= read_active:
                return []
            if plan(current, jobs).settle != settle:
                return []
            drafts = [Draft("objective.settled", settle)]
            if audit:
                drafts.append(Draft("objective.audit_requested", {"auditJobId": audit}))
            return drafts

        await _recorded(tx, state.objective_id, decide, guard)
    factory_metrics.FACTORY_OBJECTIVES_SETTLED.labels(settle["status"]).inc()
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
    store: Store,
    objective_id: str,
    kind: str,
    guard: objectives.Guard | None = None,
    caps: OrgCaps | None = None,
) -> tuple[ObjectiveState | None, Plan]:
    """Read the objective and its jobs, plan one pass and carry it out. Returns the state the
    pass was planned on and the plan as carried out: ready tasks the organization's `caps` held
    are in `held`, not in `dispatch` (a pass that only held tasks did nothing). `guard` runs in
    every transaction that writes the objective (`objectives.update`)."""
    state = await objectives.get(store, objective_id)
    if state is None:
        return None, Plan()
    if state.run_job_id and not (state.terminal or state.cancel_requested):
        state = await _cancel_if_run_aborted(store, state, guard)
    jobs = await objectives.jobs_by_ids(store, state.active_job_ids())
    decided = plan(state, jobs)
    if decided.records:

        def decide(current: ObjectiveState | None) -> list[Draft]:
            # Re-decided under the stream's lock: the monitor may have recorded some already.
            return settlement_drafts(current, jobs) if current is not None else []

        async with store.transaction() as tx:
            await objectives.update(tx, objective_id, decide, guard)
    for job_id, reason in decided.aborts:
        posted = await ops.add_command(
            store, job_id, type="abort", reason=reason, check_organization=False
        )
        if not posted.ok:
            continue  # settled since the pass read it: nothing aborted
        why = _abort_why(reason)
        factory_metrics.FACTORY_ABORTS.labels(why).inc()
        log.info(
            "control aborted a job of the objective: %s",
            reason,
            extra={
                "event": "factory.job_aborted",
                "objectiveId": objective_id,
                "jobId": job_id,
                "why": why,
            },
        )
    try:
        for number, task in enumerate(decided.dispatch):
            try:
                await _dispatch_task(store, state, task, guard, caps)
            except _Held as held:
                decided = _held(state, decided, number, *held.args)
                break
        if decided.step:
            await _dispatch_step(store, state, decided.step, guard)
        if decided.settle:
            await _settle(store, state, decided.settle, kind, guard, jobs)
    except _Moved:
        # Nothing of this write stands; the next pass plans on the objective as it is now.
        factory_metrics.FACTORY_CONTROL_STALE_PLANS.inc()
        log.info(
            "the objective moved on while a control pass wrote; planning again",
            extra={"event": "factory.control_plan_stale", "objectiveId": objective_id},
        )
    return state, decided


async def _cancel_if_run_aborted(
    store: Store, state: ObjectiveState, guard: objectives.Guard | None
) -> ObjectiveState:
    """A cancel posted before the objective existed aborted its run job (the api found no
    objective to cancel): the objective that run job created anyway is canceled here, by the
    control pass its creation requested in the same transaction, so no worker dying between the
    creation and anything after it loses the cancel."""
    assert state.run_job_id is not None
    run = await store.get_job(state.run_job_id)
    if run is None or not run.abort_requested:
        return state
    reason = run.abort_reason or "canceled before it was created"

    def decide(current: ObjectiveState | None) -> list[Draft]:
        if current is None or current.terminal or current.cancel_requested:
            return []
        return [Draft("objective.cancel_requested", {"reason": reason})]

    async with store.transaction() as tx:
        now, written = await objectives.update(tx, state.objective_id, decide, guard)
    if written:
        log.info(
            "objective canceled: its run job was aborted before it created it",
            extra={"event": "factory.objective_cancel_early", "objectiveId": state.objective_id},
        )
    return now if now is not None else state


def _abort_why(reason: str) -> str:
    """The metric's label for a plan's abort reason (`decide.plan` writes them)."""
    if reason == "objective canceled":
        return "canceled"
    if reason.startswith("superseded"):
        return "superseded"
    return "task_stopped"


def _held(state: ObjectiveState, decided: Plan, dispatched: int, queued: int, active: int) -> Plan:
    """The pass's plan once the organization's caps held its dispatch after `dispatched` tasks:
    the rest stay pending for a later pass."""
    held = tuple(task.task_id for task in decided.dispatch[dispatched:])
    factory_metrics.FACTORY_TASKS_HELD.inc(len(held))
    log.info(
        "task dispatch held: the organization holds its caps of open jobs",
        extra={
            "event": "factory.tasks_held",
            "objectiveId": state.objective_id,
            "organizationId": state.organization_id,
            "held": len(held),
            "queued": queued,
            "active": active,
        },
    )
    return dataclasses.replace(decided, dispatch=decided.dispatch[:dispatched], held=held)


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
    held: list[str] = field(default_factory=list)
    recorded: int = 0
    aborted: list[str] = field(default_factory=list)
    settled: str | None = None
    steps: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The control job's result."""
        return {
            "passes": self.passes,
            "dispatched": self.dispatched,
            "held": self.held,
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
    caps: OrgCaps | None = None,
) -> ReconcileResult:
    """Run passes until one finds nothing to do, then record `objective.reconciled` through the
    seq that quiet pass observed: every control request up to it is covered (tasks the
    organization's `caps` held are left to a later pass: `held`, the last pass's). `guard` runs
    in every transaction that writes the objective."""
    result = ReconcileResult()
    for _ in range(MAX_PASSES):
        state, decided = await run_pass(store, objective_id, kind, guard, caps)
        result.passes += 1
        if state is None:
            return result
        result.recorded += len(decided.records)
        result.aborted += [job_id for job_id, _ in decided.aborts]
        result.dispatched += [t.task_id for t in decided.dispatch]
        result.held = list(decided.held)
        if decided.step:
            result.steps.append(decided.step)
        if decided.settle:
            result.settled = decided.settle["status"]
        if decided.empty:
            async with store.transaction() as tx:
                await objectives.update(tx, objective_id, _covered_through(state.seq), guard)
            return result
    factory_metrics.FACTORY_CONTROL_PASSES_EXHAUSTED.inc()
    log.warning(
        "control passes did not settle down; the outbox will run another job",
        extra={"event": "factory.control_passes_exhausted", "objectiveId": objective_id},
    )
    return result
