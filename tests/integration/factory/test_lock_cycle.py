"""The objective lock order: job rows, then the objective's stream, then a job write's
organization counter row (org_open_jobs, the slot pg_backend_pid() % 16 shared by one backend in
16, migration 0009). A task's settle and a control pass's dispatch took the counter row before
the stream, a delivery (the outbox, the watchdog, a user's cancel) after it: two backends of one
slot waited on each other, and one was aborted after deadlock_timeout (1 s). Those paths now
take the stream first (CONTROL_OUTBOX's lock, control.py). The racers are closures over the
round's ids, awaited within it."""
# ruff: noqa: B023

from __future__ import annotations

import asyncio
from typing import Any

from receipts import assembly
from receipts import operations as ops
from receipts.errors import TransientStorageError
from receipts.objectives import control
from receipts.objectives import store as objectives
from receipts.objectives.model import task_job_id
from receipts.store import Store, Tx
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


async def test_a_cancel_racing_a_control_pass_dispatch_never_deadlocks(
    fresh_store: Store, fresh_db: str
) -> None:
    """A control pass dispatches a task (the task job's enqueue updates the organization's
    counter slot; the objective's stream was locked after it) while a cancel arrives (the
    stream, then the control job's enqueue updates the counter slot): one of them was aborted
    after deadlock_timeout (1 s). The pass's guard is slowed to hold the window open."""
    a, b = await colliding_pair(fresh_db)
    try:
        await create_objective(fresh_store, "dl", [{"taskId": "x", "input": {"command": ["true"]}}])
        window = 0.3

        async def slow_guard(tx: Tx, objective_id: str) -> None:
            await asyncio.sleep(window)  # between the pass's enqueue and its objective write

        async def passing() -> Any:
            try:
                return await control.run_pass(a, "dl", CONTROL, slow_guard)
            except TransientStorageError as exc:
                return exc

        async def cancelling() -> Any:
            await asyncio.sleep(window / 3)
            try:
                async with b.transaction() as tx:
                    return await objectives.request_cancel(tx, "dl", "stop")
            except TransientStorageError as exc:
                return exc

        results = await asyncio.gather(passing(), cancelling())
        failures = [r for r in results if isinstance(r, TransientStorageError)]
        assert not failures, failures
    finally:
        await a.close()
        await b.close()


async def test_a_task_settle_racing_the_outbox_delivery_never_deadlocks(
    fresh_store: Store, fresh_db: str
) -> None:
    """A task's job completes (its row, the counter slot, then — the settle hook — the
    objective's stream) while the outbox delivers the objective's control request (the stream,
    then the control job's enqueue: the counter slot). No hook: both are the product's own
    calls, repeated until they interleave."""
    a, b = await colliding_pair(fresh_db)
    deadlocks = 0
    rounds = 5  # before the order was mended, every round deadlocked
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
