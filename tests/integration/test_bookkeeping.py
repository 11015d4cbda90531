"""The bookkeeping writer (receipts/bookkeeping.py) against real PostgreSQL: rows queued without a
wait, written in order in one round trip per batch, and a failure that never touches a receipt."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from receipts import bookkeeping, deliveries, metrics
from receipts import operations as ops
from receipts.store import Store
from tests.integration.helpers import put, types


def activity_row(job_id: str, status: str, attempt: int = 1) -> dict[str, Any]:
    return {
        "workflow_id": f"wf-{job_id}",
        "activity_id": "attempt:1",
        "attempt": attempt,
        "job_id": job_id,
        "kind": "factory.task.run",
        "activity": "execute_attempt",
        "worker_id": "w",
        "status": status,
    }


async def ledger(store: Store, job_id: str) -> list[tuple[Any, ...]]:
    return await store.fetch("tooling_activity_runs", {"job_id": job_id})


async def test_rows_are_queued_without_a_wait_and_written_in_their_order(store: Store) -> None:
    job_id = (await put(store)).job.job_id
    deliveries.ledger_activity(store, **activity_row(job_id, "started"))
    deliveries.ledger_activity(store, **activity_row(job_id, "completed"))
    assert await ledger(store, job_id) == []  # nothing written yet: queued
    for _ in range(300):  # within the writer's linger (0.5 s for a ledger row) and a round trip
        if await ledger(store, job_id):
            break
        await asyncio.sleep(0.01)
    # `started` then `completed` on one key: the later row wins, as it was queued later.
    assert await ledger(store, job_id) == [(1, "completed")]


async def test_a_batch_is_one_round_trip(store: Store, db_url: str) -> None:
    from tools.bench.roundtrips import CountingProxy

    proxy = CountingProxy(db_url)
    url = await proxy.start()
    counted = await Store.open(url, policies=())
    try:
        job_id = (await put(store)).job.job_id
        writer = bookkeeping.Bookkeeper(counted, linger_s=3600)  # flushed by hand below
        await counted.ping()  # the pool's connection is open before counting
        before = proxy.snapshot()
        for attempt in range(1, 41):
            writer.submit(
                "ledger_activity", {**activity_row(job_id, "started", attempt), "detail": None}
            )
        await writer.flush()
        sent = proxy.snapshot().minus(before)
    finally:
        await counted.close()
        await proxy.close()
    assert sent.statements == 40
    assert sent.round_trips <= 2  # one pipeline (and at most a pool check)
    assert len(await ledger(store, job_id)) == 40


async def test_a_refused_row_is_counted_and_dropped_and_the_receipts_stand(
    store: Store,
) -> None:
    job = (await put(store)).job
    worker = f"{job.job_id}:attempt:1/1"
    started = await ops.start_attempt(
        store, job.job_id, attempt=1, worker_id=worker, lease_ms=60_000
    )
    assert started.ok
    writer = bookkeeping.Bookkeeper(store, linger_s=3600)
    before = metrics.value("receipt_ledger_write_failures_total", table="ledger_activity")
    writer.submit("ledger_activity", {**activity_row(job.job_id, "started"), "detail": None})
    # A row the database refuses (status is NOT NULL) in the same batch.
    writer.submit("ledger_activity", {**activity_row(job.job_id, None, 2), "detail": None})  # type: ignore[arg-type]
    writer.submit("delivery_record", {"job_id": job.job_id, "generation": 0, "workflow_id": "wf"})
    await writer.flush()
    after = metrics.value("receipt_ledger_write_failures_total", table="ledger_activity")
    assert after - before == 1
    # The other rows of the batch were written one by one; the job's chain and row are intact.
    assert await ledger(store, job.job_id) == [(1, "started")]
    assert await types(store, job.job_id) == ["job.enqueued", "job.leased", "job.heartbeat"]
    current = await store.get_job(job.job_id)
    assert current is not None and current.status == "running" and current.seq == 3
    done = await ops.complete(store, job.job_id, worker_id=worker, attempt=1)
    assert done.ok


async def test_an_unreachable_database_drops_the_batch_without_raising(db_url: str) -> None:
    dead = await Store.open(db_url, policies=())
    await dead.close()  # every later checkout fails at once
    writer = bookkeeping.Bookkeeper(dead, linger_s=3600)
    before = metrics.value("receipt_ledger_write_failures_total", table="delivery_record")
    writer.submit("delivery_record", {"job_id": "j", "generation": 0, "workflow_id": "wf"})
    await writer.flush()
    assert (
        metrics.value("receipt_ledger_write_failures_total", table="delivery_record") == before + 1
    )


async def test_only_bookkeeping_statements_are_queued(store: Store) -> None:
    with pytest.raises(ValueError, match="not a bookkeeping statement"):
        bookkeeping.Bookkeeper(store).submit("append_job", {})


async def test_a_generation_record_is_written_at_once_with_the_rows_before_it(
    store: Store,
) -> None:
    """A ledger row may wait (here an hour); a generation record is written when `record`
    returns, and the ledger row queued before it in the same round trip."""
    job_id = (await put(store)).job.job_id
    writer = bookkeeping.writer(store)
    writer.linger_s = 3600
    try:
        deliveries.ledger_activity(store, **activity_row(job_id, "started"))
        await asyncio.sleep(0.1)
        assert await ledger(store, job_id) == []  # lingering
        await deliveries.record(store, job_id, 3)
        assert await ledger(store, job_id) == [(1, "started")]
        latest = await deliveries.job_and_latest(store, job_id)
        assert latest[1] is not None and latest[1].generation == 3
    finally:
        writer.linger_s = bookkeeping.LINGER_S
