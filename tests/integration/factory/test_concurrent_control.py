"""Objective control under real concurrency (two stores, gathered passes, cancels, task
settlements and monitor mirrors at once), repeated. Invariants from the receipt chains. The
racers are closures over the round's ids, awaited within the round (B023 does not apply)."""
# ruff: noqa: B023

from __future__ import annotations

import asyncio
import os
import random
import uuid
from typing import Any

import pytest

from receipts import assembly
from receipts import operations as ops
from receipts.objectives import control
from receipts.objectives import store as objectives
from receipts.objectives.model import fold, objective_stream
from receipts.store import Store
from tests.integration.helpers import create_objective

ROUNDS = int(os.environ.get("RACE_ROUNDS", "10"))
CONTROL = "factory.objective.control"


@pytest.fixture
async def two(fresh_store: Store, fresh_db: str) -> Any:
    other = await assembly.open_store(fresh_db, min_size=2, max_size=10)
    yield fresh_store, other
    await other.close()


async def jitter() -> None:
    await asyncio.sleep(random.random() * 0.004)


async def task_jobs(store: Store, objective_id: str) -> dict[str, Any]:
    """Every job named as a try of one of the objective's tasks (not monitors)."""
    async with store.connection() as conn:
        cur = await conn.execute(
            "SELECT job_id, status, abort_requested FROM jobs WHERE job_id LIKE %(p)s",
            {"p": f"objective:{objective_id}:task:%"},
        )
        rows = await cur.fetchall()
    return {r[0]: (r[1], r[2]) for r in rows if not r[0].endswith(":monitor")}


async def check(store: Store, objective_id: str) -> Any:
    """The invariants: the projection is the chain's fold; every task try job in the table is
    a try the objective recorded (no orphan job left running outside the objective); each
    try recorded once; a settled objective has no try job still open."""
    receipts = await store.read_stream(objective_stream(objective_id))
    state = fold(receipts)
    assert state is not None
    row = await objectives.get(store, objective_id)
    assert row is not None and row.seq == state.seq
    recorded = {t_try.job_id for t in state.tasks for t_try in t.tries}
    dispatched = [r.data["jobId"] for r in receipts if r.type == "objective.task.dispatched"]
    assert len(dispatched) == len(set(dispatched)), dispatched
    jobs = await task_jobs(store, objective_id)
    orphans = set(jobs) - recorded
    assert not orphans, (orphans, {j: jobs[j] for j in orphans})
    if state.terminal:
        open_ = {j: s for j, s in jobs.items() if s[0] not in ("completed", "failed", "canceled")}
        assert not open_, (state.status, open_)
        settled = [r for r in receipts if r.type == "objective.settled"]
        assert len(settled) == 1, settled
    return state


async def play_jobs(store: Store, objective_id: str, fail_some: bool) -> None:
    """Start and end each open try job of the objective (as a worker would)."""
    for job_id, (status, _aborted) in (await task_jobs(store, objective_id)).items():
        if status != "queued":
            continue
        worker = f"{job_id}:attempt:1/1"
        started = await ops.start_attempt(
            store, job_id, attempt=1, worker_id=worker, lease_ms=60_000
        )
        if not started.ok:
            continue
        await jitter()
        if fail_some and random.random() < 0.2:
            await ops.fail(store, job_id, worker_id=worker, attempt=1, error="x", retryable=False)
        else:
            await ops.complete(store, job_id, worker_id=worker, attempt=1, result={"ok": 1})


async def mirror(store: Store, objective_id: str) -> None:
    """A monitor mirroring the settlements of ended jobs (first wins with control)."""
    state = await objectives.get(store, objective_id)
    if state is None:
        return
    jobs = await objectives.jobs_by_ids(store, state.active_job_ids())
    async with store.transaction() as tx:
        await objectives.update(
            tx, objective_id, lambda s: control.settlement_drafts(s, jobs) if s else []
        )


TASKS = [
    {"taskId": "a", "input": {"command": ["true"]}, "maxAttempts": 2},
    {"taskId": "b", "input": {"command": ["true"]}},
    {"taskId": "c", "input": {"command": ["true"]}, "dependsOn": ["a"]},
    {"taskId": "d", "input": {"command": ["true"]}, "dependsOn": ["a", "b"]},
    {"taskId": "e", "input": {"command": ["true"]}},
]


async def test_two_control_passes_with_settlements_and_mirrors(two: Any) -> None:
    a, b = two
    for n in range(ROUNDS):
        oid = f"race2-{n}-{uuid.uuid4().hex[:4]}"
        await create_objective(a, oid, TASKS)
        for _ in range(20):
            await asyncio.gather(
                control.reconcile(a, oid, CONTROL),
                control.reconcile(b, oid, CONTROL),
                play_jobs(a, oid, fail_some=n % 2 == 1),
                mirror(b, oid),
            )
            state = await check(a, oid)
            if state.terminal:
                break
        state = await check(a, oid)
        assert state.terminal, state.status


async def test_cancel_racing_control_passes_dispatch(two: Any) -> None:
    a, b = two
    for n in range(ROUNDS * 2):
        oid = f"racec-{n}-{uuid.uuid4().hex[:4]}"
        await create_objective(a, oid, TASKS)

        async def cancelling() -> Any:
            await asyncio.sleep(random.random() * 0.02)
            async with b.transaction() as tx:
                return await objectives.request_cancel(tx, oid, "stop")

        await asyncio.gather(
            control.reconcile(a, oid, CONTROL),
            control.reconcile(b, oid, CONTROL),
            cancelling(),
            play_jobs(a, oid, fail_some=False),
        )
        await check(a, oid)
        for _ in range(10):
            await asyncio.gather(
                control.reconcile(a, oid, CONTROL),
                control.reconcile(b, oid, CONTROL),
                play_jobs(a, oid, fail_some=False),
                mirror(b, oid),
            )
            state = await check(a, oid)
            if state.terminal:
                break
        state = await check(a, oid)
        assert state.status == "canceled", state.status
