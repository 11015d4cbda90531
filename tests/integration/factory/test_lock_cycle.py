"""The objective lock order ("job rows first, then the objective's stream", docs/factory.md) is
broken by the org_open_jobs counters: a job write updates the counter row of its backend's slot
(pg_backend_pid() % 16, migration 0009) before a stream lock in some paths (a control pass's task
dispatch, a task's settle hook) and after it in others (`deliver`, so `request_cancel`, the
outbox, the watchdog): two backends of one slot wait on each other in a cycle, and PostgreSQL
aborts one after deadlock_timeout (1 s); it is retried, nothing is lost. Known and not yet mended
(docs/factory.md, "Lock order": updating the counters at commit was tried, but a deferred
trigger runs after statement_timeout is disarmed, so the api's bounded enqueue could wait on a
counter row for ever). The racers are closures over the round's ids, awaited within it."""
# ruff: noqa: B023

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from receipts import assembly
from receipts import operations as ops
from receipts.errors import TransientStorageError
from receipts.objectives import control
from receipts.objectives import store as objectives
from receipts.objectives.model import task_job_id
from receipts.store import Store
from tests.integration.helpers import create_objective

CONTROL = "factory.objective.control"


async def pid(store: Store) -> int:
    async with store.connection() as conn:
        cur = await conn.execute("SELECT pg_backend_pid()")
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def colliding_pair(url: str) -> tuple[Store, Store]:
    """Two one-connection stores whose backends share an org_open_jobs slot (pid % 16)."""
    first = await assembly.open_store(url, min_size=1, max_size=1)
    target = await pid(first) % 16
    for _ in range(200):
        other = await assembly.open_store(url, min_size=1, max_size=1)
        if await pid(other) % 16 == target:
            return first, other
        await other.close()
    raise AssertionError("no colliding backend in 200 tries")


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="a known lock cycle through the org_open_jobs counter rows (docs/factory.md, Lock "
    "order): nothing is lost, the aborted transaction is retried; when the order is mended this "
    "test passes and must lose its mark",
)
async def test_a_task_settle_racing_the_outbox_delivery_deadlocks(
    fresh_store: Store, fresh_db: str
) -> None:
    """A task's job completes (its row, the counter slot, then — the settle hook — the
    objective's stream) while the outbox delivers the objective's control request (the stream,
    then the control job's enqueue: the counter slot). No hook: both are the product's own
    calls, repeated until they interleave."""
    a, b = await colliding_pair(fresh_db)
    deadlocks = 0
    rounds = 3  # every round deadlocked in 20 of 20 tries (each costs deadlock_timeout, 1 s)
    try:
        for n in range(rounds):
            oid = f"dl2-{n}"
            await create_objective(
                fresh_store,
                oid,
                [{"taskId": f"x{i}", "input": {"command": ["true"]}} for i in range(3)],
            )
            await control.run_pass(fresh_store, oid, CONTROL)
            for i in range(3):
                job_id = task_job_id(oid, f"x{i}", 1)
                worker = f"{job_id}:attempt:1/1"
                assert (
                    await ops.start_attempt(
                        fresh_store, job_id, attempt=1, worker_id=worker, lease_ms=60_000
                    )
                ).ok
            # A control request is outstanding (the pass left none: write one to deliver).
            async with fresh_store.transaction() as tx:
                await objectives.request_control(tx, oid, "reconcile", deliver_now=False)

            async def completing() -> Any:
                for i in range(3):
                    job_id = task_job_id(oid, f"x{i}", 1)
                    try:
                        await ops.complete(
                            a, job_id, worker_id=f"{job_id}:attempt:1/1", attempt=1, result=1
                        )
                    except TransientStorageError as exc:
                        return exc
                return None

            async def delivering() -> Any:
                for _ in range(3):
                    try:
                        async with b.transaction() as tx:
                            await objectives.deliver(tx, oid)
                            await objectives.request_control(tx, oid, "reconcile")
                    except TransientStorageError as exc:
                        return exc
                return None

            results = await asyncio.gather(completing(), delivering())
            if any(isinstance(r, TransientStorageError) for r in results):
                deadlocks += 1
        assert deadlocks == 0, f"{deadlocks} of {rounds} rounds deadlocked"
    finally:
        await a.close()
        await b.close()
