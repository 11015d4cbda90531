"""Concurrency against real PostgreSQL: racing enqueues and racing fences serialise."""

from __future__ import annotations

import asyncio

from receipts import operations as ops
from receipts.store import Store
from tests.integration.helpers import new_id, put, types


async def test_twenty_concurrent_enqueues_with_one_job_id_make_one_job(store: Store) -> None:
    job_id = new_id()
    results = await asyncio.gather(*(put(store, jobId=job_id) for _ in range(20)))
    assert sum(r.created for r in results) == 1
    assert len({r.job.job_id for r in results}) == 1
    assert await types(store, job_id) == ["job.enqueued"]


async def test_ten_concurrent_steers_on_one_session_key_make_ten_commands(store: Store) -> None:
    session = new_id("session")
    active = (await put(store, sessionKey=session)).job
    results = await asyncio.gather(
        *(put(store, sessionKey=session, singletonMode="steer") for _ in range(10))
    )
    assert {r.job.job_id for r in results} == {active.job_id}
    assert all(r.outcome == "steered" for r in results)
    assert await types(store, active.job_id) == ["job.enqueued"] + ["queue.command"] * 10
    job = await store.get_job(active.job_id)
    assert job is not None and len(job.pending_commands) == 10


async def test_concurrent_steers_with_no_active_job_create_exactly_one(store: Store) -> None:
    session = new_id("session")
    results = await asyncio.gather(
        *(put(store, sessionKey=session, singletonMode="steer") for _ in range(8))
    )
    assert sum(r.created for r in results) == 1
    assert len({r.job.job_id for r in results}) == 1


async def test_two_fences_settling_one_job_make_one_terminal_receipt(store: Store) -> None:
    job = (await put(store)).job
    assert (await ops.lease(store, job.job_id, attempt=1, worker_id="a", lease_ms=60_000)).ok
    # b takes over the same attempt with a start-fence while a tries to settle.
    outcomes = await asyncio.gather(
        ops.complete(store, job.job_id, worker_id="a", attempt=1, result="a"),
        ops.heartbeat(
            store, job.job_id, worker_id="b", attempt=1, lease_ms=60_000, start_fence=True
        ),
        ops.complete(store, job.job_id, worker_id="b", attempt=1, result="b"),
        ops.fail(store, job.job_id, worker_id="a", attempt=1, error="x", retryable=False),
    )
    written = await types(store, job.job_id)
    terminal = [t for t in written if t in ("job.completed", "job.failed", "job.canceled")]
    settled = [
        o
        for o in outcomes
        if o.ok and o.receipts and o.receipts[0].type in ("job.completed", "job.failed")
    ]
    # Never two; and exactly the settle that was told it succeeded wrote one. (If b's settle ran
    # before its own start-fence and a's after it, nobody holds a fence that can settle.)
    assert len(terminal) == len(settled) <= 1
    if not terminal:
        holder = (await store.get_job(job.job_id)).lease.worker_id  # type: ignore[union-attr]
        assert (await ops.complete(store, job.job_id, worker_id=holder, attempt=1)).ok
        assert (await types(store, job.job_id)).count("job.completed") == 1


async def test_racing_settlements_of_the_holder_make_exactly_one_terminal_receipt(
    store: Store,
) -> None:
    for _ in range(5):
        job = (await put(store)).job
        assert (await ops.lease(store, job.job_id, attempt=1, worker_id="a", lease_ms=60_000)).ok
        outcomes = await asyncio.gather(
            ops.complete(store, job.job_id, worker_id="a", attempt=1, result=1),
            ops.fail(store, job.job_id, worker_id="a", attempt=1, error="x", retryable=False),
            ops.cancel(store, job.job_id, worker_id="a", attempt=1, reason="r"),
            ops.cancel_queued(store, job.job_id, reason="r"),
        )
        written = await types(store, job.job_id)
        terminal = [t for t in written if t in ("job.completed", "job.failed", "job.canceled")]
        assert len(terminal) == 1
        assert sum(o.ok and bool(o.receipts) for o in outcomes) == 1


async def test_racing_leases_for_one_attempt_grant_one(store: Store) -> None:
    job = (await put(store)).job
    outcomes = await asyncio.gather(
        *(
            ops.lease(store, job.job_id, attempt=1, worker_id=f"w{i}", lease_ms=60_000)
            for i in range(10)
        )
    )
    assert sum(o.ok for o in outcomes) == 1
    assert await types(store, job.job_id) == ["job.enqueued", "job.leased"]


async def test_concurrent_cancel_singletons_leave_one_active_job(store: Store) -> None:
    session = new_id("session")
    await asyncio.gather(
        *(put(store, sessionKey=session, singletonMode="cancel") for _ in range(6))
    )
    async with store.transaction() as tx:
        active = await tx.session_active_for_update("org-a", session)
    assert len(active) == 1


async def test_two_organizations_on_one_session_key_do_not_interfere(store: Store) -> None:
    session = new_id("session")
    a = (await put(store, sessionKey=session, org="org-a")).job
    b = (await put(store, sessionKey=session, org="org-b")).job
    await asyncio.gather(
        put(store, sessionKey=session, org="org-a", singletonMode="steer"),
        put(store, sessionKey=session, org="org-b", singletonMode="cancel"),
    )
    job_a = await store.get_job(a.job_id)
    job_b = await store.get_job(b.job_id)
    assert job_a is not None and job_a.status == "queued" and len(job_a.commands) == 1
    assert job_b is not None and job_b.status == "canceled" and job_b.commands == ()
