"""Objective control against writes that land in another order than the one it expects, on real
PostgreSQL: the outcome must not depend on which of two writers committed first."""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from typing import Any

import pytest

from activities.fence import AttemptFence
from activities.handlers.context import HandlerContext, HandlerError, HandlerSettings
from activities.handlers.factory import factory_dispatch, objective_control
from activities.handlers.fenced import FencedReceipts, FenceLost
from receipts import assembly
from receipts import operations as ops
from receipts.delivery_ids import delivery_id
from receipts.objectives import control
from receipts.objectives import store as objectives
from receipts.objectives.model import (
    fold,
    objective_stream,
    session_key,
    step_job_id,
    task_job_id,
)
from receipts.store import Store
from tests.integration.helpers import create_objective, put

CONTROL = "factory.objective.control"


async def run_job(store: Store, job_id: str, outcome: str) -> None:
    """A worker runs `job_id` once and ends it `outcome` (`completed` or `failed`)."""
    worker = f"{job_id}:attempt:1/1"
    started = await ops.start_attempt(store, job_id, attempt=1, worker_id=worker, lease_ms=60_000)
    assert started.ok, started
    if outcome == "completed":
        await ops.complete(store, job_id, worker_id=worker, attempt=1, result={"ok": 1})
    else:
        await ops.fail(store, job_id, worker_id=worker, attempt=1, error="tests failed",
                       retryable=False)  # fmt: skip


async def mirror(store: Store, objective_id: str) -> None:
    """The monitor records the settlement of an ended job (`monitor._mirror_settlement`)."""
    state = await objectives.get(store, objective_id)
    assert state is not None
    jobs = await objectives.jobs_by_ids(store, state.active_job_ids())
    async with store.transaction() as tx:
        await objectives.update(
            tx, objective_id, lambda s: control.settlement_drafts(s, jobs) if s else []
        )


async def dispatch_phase(store: Store, objective_id: str, tasks: list[dict[str, Any]]) -> None:
    """`factory.dispatch` adds a phase, run by its handler under its attempt's fence."""
    job = (
        await put(
            store,
            "factory",
            kind="factory.dispatch",
            payload_extra={"objectiveId": objective_id, "tasks": tasks},
        )
    ).job
    fence = AttemptFence(store, job.job_id, attempt=1, worker_id=f"{job.job_id}:attempt:1/1")
    out = await fence.start(60_000, {"role": "test"})
    assert out.ok and out.job is not None
    ctx = HandlerContext(
        job=out.job,
        attempt=1,
        worker_id=fence.worker_id,
        receipts=FencedReceipts(fence, out.job.session_key, "org-a"),
        settings=HandlerSettings(),
    )
    await factory_dispatch(ctx)


@pytest.mark.parametrize("first", ["phase", "record"])
async def test_a_fix_phase_and_a_failed_validates_record_agree_in_either_order(
    fresh_store: Store, first: str
) -> None:
    """Validate failed on phase 1's code, and `factory.dispatch` adds a phase to fix it. Its
    failure covered phase 1 only: the new phase runs, then validate again — whether the
    monitor recorded the failure just after the phase landed or just before it (the objective
    still active, so the phase is accepted). Recorded first, the phase was accepted and the
    objective then failed on the old validate, its new task never dispatched."""
    store = fresh_store
    oid = f"fix-{first}"
    await create_objective(store, oid, validate={"command": ["true"]})
    await control.reconcile(store, oid, CONTROL)
    await run_job(store, task_job_id(oid, "t", 1), "completed")
    await control.reconcile(store, oid, CONTROL)  # records t, dispatches validate
    state = await objectives.get(store, oid)
    assert state is not None and state.validate_step is not None
    assert state.validate_step.status == "dispatched"
    await run_job(store, step_job_id(oid, "validate", 1), "failed")
    fix = [{"taskId": "fix", "input": {"command": ["true"]}}]
    if first == "phase":
        await dispatch_phase(store, oid, fix)
        await mirror(store, oid)
    else:
        await mirror(store, oid)
        await dispatch_phase(store, oid, fix)
    result = await control.reconcile(store, oid, CONTROL)
    state = await objectives.get(store, oid)
    assert state is not None
    assert (state.status, result.dispatched) == ("active", ["fix"]), (state.status, state.error)
    assert state.validate_step is not None and state.validate_step.status == "pending"


# --- the control job, the watchdog, the outbox, workers and monitors all at once ---------------

ROUNDS = int(os.environ.get("RACE_ROUNDS", "6"))
TASKS: list[dict[str, Any]] = [
    {"taskId": "a", "input": {"command": ["true"]}, "maxAttempts": 2},
    {"taskId": "b", "input": {"command": ["true"]}},
    {"taskId": "c", "input": {"command": ["true"]}, "dependsOn": ["a"]},
    {"taskId": "d", "input": {"command": ["true"]}, "dependsOn": ["a", "b"]},
]


@pytest.fixture
async def two(fresh_store: Store, fresh_db: str) -> Any:
    other = await assembly.open_store(fresh_db, min_size=2, max_size=10)
    yield fresh_store, other
    await other.close()


async def rows(store: Store, sql: str, **params: Any) -> list[Any]:
    async with store.connection() as conn:
        cur = await conn.execute(sql, params)
        return list(await cur.fetchall())


async def active_controls(store: Store, oid: str) -> list[str]:
    found = await rows(
        store,
        "SELECT job_id FROM jobs WHERE session_key = %(k)s"
        " AND status IN ('queued', 'leased', 'running')",
        k=session_key(oid),
    )
    return [r[0] for r in found]


async def run_controls(store: Store, oid: str, seen: list[int]) -> None:
    """A worker-control: run each queued control job of the objective through its handler."""
    for job_id in await active_controls(store, oid):
        fence = AttemptFence(store, job_id, attempt=1, worker_id=f"{job_id}:w")
        out = await fence.start(60_000, {"role": "test"})
        if not out.ok or out.job is None:
            continue
        seen.append(len(await active_controls(store, oid)))
        ctx = HandlerContext(
            job=out.job,
            attempt=1,
            worker_id=fence.worker_id,
            receipts=FencedReceipts(fence, out.job.session_key, out.job.organization_id),
            settings=HandlerSettings(),
        )
        try:
            result = await objective_control(ctx)
        except FenceLost:
            # The other racer ran the same job under the same delivery id and settled it first
            # (make test met it once under load): this delivery's writes are refused, as a
            # superseded delivery's are, and it ends.
            continue
        await asyncio.sleep(random.random() * 0.003)
        await fence.complete(result)


async def play(store: Store, oid: str, fail_some: bool) -> None:
    """Workers run each queued try and step job of the objective."""
    found = await rows(
        store,
        "SELECT job_id FROM jobs WHERE job_id LIKE %(p)s AND status = 'queued'"
        " AND job_id NOT LIKE '%%monitor' AND job_id NOT LIKE '%%:control:%%'"
        " AND job_id NOT LIKE '%%:audit'",
        p=f"objective:{oid}:%",
    )
    for (job_id,) in found:
        worker = f"{job_id}:attempt:1/1"
        started = await ops.start_attempt(
            store, job_id, attempt=1, worker_id=worker, lease_ms=60_000
        )
        if not started.ok:
            continue
        await asyncio.sleep(random.random() * 0.003)
        if fail_some and random.random() < 0.3:
            await ops.fail(store, job_id, worker_id=worker, attempt=1, error="x", retryable=False)
        else:
            await ops.complete(store, job_id, worker_id=worker, attempt=1, result={"ok": 1})


async def watchdog(store: Store, oid: str) -> None:
    await asyncio.sleep(random.random() * 0.01)
    async with store.transaction() as tx:
        await objectives.request_control(tx, oid, "reconcile", watchdog="test")


async def quiet_mirror(store: Store, oid: str) -> None:
    await asyncio.sleep(random.random() * 0.01)
    await mirror(store, oid)


async def cancel_late(store: Store, oid: str) -> None:
    await asyncio.sleep(random.random() * 0.03)
    async with store.transaction() as tx:
        try:
            await objectives.request_cancel(tx, oid, "stop")
        except objectives.ObjectiveTerminal:
            pass


async def phase_late(store: Store, oid: str, number: int) -> None:
    await asyncio.sleep(random.random() * 0.03)
    try:
        await dispatch_phase(store, oid, [{"taskId": f"p{number}", "input": {"command": ["true"]}}])
    except HandlerError:
        pass  # settled meanwhile


@pytest.mark.parametrize("extra", ["none", "cancel", "phase"])
async def test_control_jobs_watchdog_outbox_workers_and_monitors_at_once(
    two: Any, extra: str
) -> None:
    """Every control request is answered by one control job at a time, each try is dispatched
    once, and the objective settles once, whatever order they meet in."""
    a, b = two
    for n in range(ROUNDS):
        oid = f"all-{n}-{uuid.uuid4().hex[:4]}"
        await create_objective(a, oid, TASKS, validate={"command": ["true"]})
        async with a.transaction() as tx:
            await objectives.request_control(tx, oid, "created")
        seen: list[int] = []
        for k in range(40):
            racers = []
            if extra == "cancel" and k == 1:
                racers.append(cancel_late(a, oid))
            if extra == "phase" and k in (1, 2):
                racers.append(phase_late(a, oid, k))
            await asyncio.gather(
                *racers,
                run_controls(a, oid, seen),
                run_controls(b, oid, seen),
                play(a, oid, fail_some=n % 2 == 1),
                watchdog(b, oid),
                quiet_mirror(b, oid),
                objectives.redrive_outbox(a),
            )
            state = await objectives.get(a, oid)
            assert state is not None
            if state.terminal:
                break
        assert all(count <= 1 for count in seen), seen
        receipts = await a.read_stream(objective_stream(oid))
        state = fold(receipts)
        assert state is not None and state.terminal, state
        dispatched = [r.data["jobId"] for r in receipts if r.type == "objective.task.dispatched"]
        assert len(dispatched) == len(set(dispatched)), dispatched
        assert len([r for r in receipts if r.type == "objective.settled"]) == 1
        assert len([r for r in receipts if r.type == "objective.audit_requested"]) == 1
        jobs = await rows(
            a,
            "SELECT job_id, status FROM jobs WHERE job_id LIKE %(p)s AND job_id LIKE '%%:try:%%'"
            " AND job_id NOT LIKE '%%monitor'",
            p=f"objective:{oid}:task:%",
        )
        recorded = {t_try.job_id for t in state.tasks for t_try in t.tries}
        assert {j for j, _ in jobs} <= recorded, (jobs, recorded)  # no try job left unrecorded
        open_ = [(j, s) for j, s in jobs if s not in ("completed", "failed", "canceled")]
        assert not open_, (state.status, open_)


async def test_a_control_delivery_taken_over_writes_nothing_to_its_objective(
    fresh_store: Store,
) -> None:
    """A stalled control delivery whose attempt a later delivery took over (the older fence)
    dispatches nothing, records nothing and settles nothing: its first write is refused."""
    store = fresh_store
    oid = "stale-control"
    await create_objective(store, oid, TASKS)
    async with store.transaction() as tx:
        await objectives.request_control(tx, oid, "created")
    (job_id,) = await active_controls(store, oid)
    old = AttemptFence(store, job_id, attempt=1, worker_id=delivery_id(job_id, 1, "run", 1))
    out = await old.start(60_000, {"role": "test"})
    assert out.ok and out.job is not None
    new = AttemptFence(store, job_id, attempt=1, worker_id=delivery_id(job_id, 1, "run", 2))
    assert (await new.start(60_000, {"role": "test"})).ok
    before = await objectives.get(store, oid)
    ctx = HandlerContext(
        job=out.job,
        attempt=1,
        worker_id=old.worker_id,
        receipts=FencedReceipts(old, out.job.session_key, out.job.organization_id),
        settings=HandlerSettings(),
    )
    with pytest.raises(FenceLost):
        await objective_control(ctx)
    after = await objectives.get(store, oid)
    assert before is not None and after is not None and after.seq == before.seq
    found = await rows(store, "SELECT job_id FROM jobs WHERE job_id LIKE %(p)s",
                       p=f"objective:{oid}:task:%")  # fmt: skip
    assert found == []


async def test_a_dispatch_redelivered_after_its_phase_landed_reports_that_phase(
    fresh_store: Store,
) -> None:
    """A `factory.dispatch` delivery committed its phase and stalled before settling its job;
    the delivery that took its attempt over runs the handler again. Its phase is the one that
    landed: not a second phase, and not a non-retryable failure ("task id already used by
    phase 2") of a job whose phase was added."""
    store = fresh_store
    oid = "redelivered-dispatch"
    await create_objective(store, oid)
    fix = [{"taskId": "fix", "input": {"command": ["true"]}}]
    job = (
        await put(
            store,
            "factory",
            kind="factory.dispatch",
            payload_extra={"objectiveId": oid, "tasks": fix},
        )
    ).job
    results = []
    for delivery in (1, 2):
        fence = AttemptFence(
            store, job.job_id, attempt=1, worker_id=delivery_id(job.job_id, 1, "run", delivery)
        )
        out = await fence.start(60_000, {"role": "test"})
        assert out.ok and out.job is not None
        ctx = HandlerContext(
            job=out.job,
            attempt=1,
            worker_id=fence.worker_id,
            receipts=FencedReceipts(fence, out.job.session_key, "org-a"),
            settings=HandlerSettings(),
        )
        results.append(await factory_dispatch(ctx))
    assert [r["phase"] for r in results] == [2, 2], results
    state = await objectives.get(store, oid)
    assert state is not None and state.phase == 2


async def test_a_request_steered_into_a_control_job_after_its_last_look_is_redriven(
    fresh_store: Store,
) -> None:
    """The control job looked at the objective for the last time (nothing uncovered) and ends;
    a watchdog request lands just then and is steered into it (delivered, not covered). Once
    the job ends, the outbox owes the objective a new control job: the request is not lost."""
    store = fresh_store
    oid = "late-steer"
    await create_objective(store, oid)
    async with store.transaction() as tx:
        await objectives.request_control(tx, oid, "created")
    (job_id,) = await active_controls(store, oid)
    fence = AttemptFence(store, job_id, attempt=1, worker_id=f"{job_id}:w")
    out = await fence.start(60_000, {"role": "test"})
    assert out.ok and out.job is not None
    receipts = FencedReceipts(fence, out.job.session_key, out.job.organization_id)
    real = receipts.objective
    looks = 0

    async def objective(objective_id: str) -> Any:
        nonlocal looks
        looks += 1
        state = await real(objective_id)
        if looks == 2:  # the handler's last look, after its passes
            async with store.transaction() as tx:
                await objectives.request_control(tx, oid, "reconcile", watchdog="test")
        return state

    receipts.objective = objective  # type: ignore[method-assign]
    ctx = HandlerContext(
        job=out.job, attempt=1, worker_id=fence.worker_id, receipts=receipts,
        settings=HandlerSettings(),
    )  # fmt: skip
    await fence.complete(await objective_control(ctx))
    state = await objectives.get(store, oid)
    assert state is not None and not state.control_pending and state.needs_reconcile
    assert oid in await objectives.outbox_candidates(store, 10)
    await objectives.redrive_outbox(store)
    assert len(await active_controls(store, oid)) == 1


async def test_a_try_that_ends_just_after_a_quiet_pass_read_it_leaves_a_request_uncovered(
    fresh_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pass read the objective and its try's job (still running): nothing to do. The job
    ends before the pass records what it covered: the request the job's end wrote is past what
    the pass read, so it stays uncovered and the objective is owed another pass."""
    store = fresh_store
    oid = "quiet-pass"
    await create_objective(store, oid)
    await control.reconcile(store, oid, CONTROL)  # dispatches t
    job_id = task_job_id(oid, "t", 1)
    worker = f"{job_id}:attempt:1/1"
    assert (await ops.start_attempt(store, job_id, attempt=1, worker_id=worker,
                                    lease_ms=60_000)).ok  # fmt: skip
    real = objectives.jobs_by_ids
    ended = False

    async def jobs_by_ids(store_: Any, job_ids: Any) -> Any:
        nonlocal ended
        found = await real(store_, job_ids)
        if not ended and job_id in found:
            ended = True
            await ops.complete(store, job_id, worker_id=worker, attempt=1, result={"ok": 1})
        return found

    monkeypatch.setattr(objectives, "jobs_by_ids", jobs_by_ids)
    result = await control.reconcile(store, oid, CONTROL)
    assert ended and result.passes == 1 and not result.recorded
    state = await objectives.get(store, oid)
    assert state is not None and state.needs_reconcile
    assert oid in await objectives.outbox_candidates(store, 10)
    monkeypatch.setattr(objectives, "jobs_by_ids", real)
    await control.reconcile(store, oid, CONTROL)
    state = await objectives.get(store, oid)
    assert state is not None and state.status == "completed"
