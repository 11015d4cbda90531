"""The one-statement fenced write (receipts/guarded.py, receipts/sql/guarded.sql) against real
PostgreSQL: applied only to the state it was decided on; every refusal writes nothing."""

from __future__ import annotations

import asyncio
from datetime import datetime

from receipts import operations as ops
from receipts.guarded import NeedsTransaction, append_if_unchanged
from receipts.jobs import Job, fold
from receipts.store import Draft, Store
from tests.integration.helpers import create_objective, new_id, put, types

LEASE = 60_000


async def running(store: Store, worker: str = "w1", lease_ms: int = LEASE) -> str:
    job = (await put(store, maxAttempts=2)).job
    out = await ops.start_attempt(store, job.job_id, attempt=1, worker_id=worker, lease_ms=lease_ms)
    assert out.ok and out.job is not None and out.job.status == "running"
    return job.job_id


async def read(store: Store, job_id: str) -> tuple[Job, datetime]:
    job, now = await store.get_job_with_now(job_id)
    assert job is not None
    return job, now


def completed(worker: str = "w1") -> list[Draft]:
    fence = {"workerId": worker, "attempt": 1, "settlementId": worker}
    return [Draft("job.completed", {**fence, "result": {"ok": True}})]


async def snapshot(store: Store, job_id: str) -> tuple[list[str], Job | None, int]:
    owed = await store.fetch_one("count_callback_outbox", {"job_ids": [job_id]})
    assert owed is not None
    return await types(store, job_id), await store.get_job(job_id), int(owed[0])


async def test_a_write_on_the_state_read_lands_in_one_statement(store: Store) -> None:
    job_id = await running(store)
    job, now = await read(store, job_id)
    written = await append_if_unchanged(store, job_id, job, completed(), now, lease_held=True)
    assert written is not None
    new, receipts = written
    assert new.status == "completed" and [r.seq for r in receipts] == [job.seq + 1]
    assert all(r.position for r in receipts)
    assert await types(store, job_id) == [
        "job.enqueued",
        "job.leased",
        "job.heartbeat",
        "job.completed",
    ]
    # The projection is the chain's fold (recorded at the clock the write was decided with).
    assert (await store.get_job(job_id)) == new
    assert fold(await store.read_stream(f"jobs/{job_id}")) == new


async def test_a_changed_seq_is_refused_with_nothing_written(store: Store) -> None:
    job_id = await running(store)
    job, now = await read(store, job_id)
    # Another append lands between the read and the write (a progress under the same fence).
    assert (await ops.progress(store, job_id, worker_id="w1", attempt=1, data={"p": 1})).ok
    before = await snapshot(store, job_id)
    assert await append_if_unchanged(store, job_id, job, completed(), now, lease_held=True) is None
    assert await snapshot(store, job_id) == before


async def test_a_heartbeat_only_on_the_lease_row_still_moves_the_head(store: Store) -> None:
    job_id = await running(store)
    job, now = await read(store, job_id)
    beat = await ops.heartbeat(store, job_id, worker_id="w1", attempt=1, lease_ms=LEASE)
    assert beat.ok
    before = await snapshot(store, job_id)
    assert await append_if_unchanged(store, job_id, job, completed(), now, lease_held=True) is None
    assert await snapshot(store, job_id) == before


async def test_an_expired_lease_is_refused_at_the_statements_clock(store: Store) -> None:
    job_id = await running(store, lease_ms=300)
    job, now = await read(store, job_id)  # read while the lease is live
    await asyncio.sleep(0.5)
    before = await snapshot(store, job_id)
    assert await append_if_unchanged(store, job_id, job, completed(), now, lease_held=True) is None
    assert await snapshot(store, job_id) == before
    # Through the operation: decided again on a fresh read, the fence says why.
    out = await ops.complete(store, job_id, worker_id="w1", attempt=1, known=(job, now))
    assert out.status == "lease_lost"
    assert await snapshot(store, job_id) == before


async def test_a_stale_fence_and_a_settled_job_are_refused(store: Store) -> None:
    job_id = await running(store, worker="j:attempt:1/1")
    stale, now = await read(store, job_id)
    # A later delivery takes the lease over (start-fence): the earlier one's settle is stale.
    taken = await ops.start_attempt(
        store, job_id, attempt=1, worker_id="j:attempt:1/2", lease_ms=LEASE
    )
    assert taken.ok
    before = await snapshot(store, job_id)
    out = await ops.complete(
        store, job_id, worker_id="j:attempt:1/1", attempt=1, known=(stale, now)
    )
    assert out.status == "lease_lost"
    assert (
        await append_if_unchanged(
            store, job_id, stale, completed("j:attempt:1/1"), now, lease_held=True
        )
        is None
    )
    assert await snapshot(store, job_id) == before
    done = await ops.complete(store, job_id, worker_id="j:attempt:1/2", attempt=1)
    assert done.ok
    settled, now = await read(store, job_id)
    after = await snapshot(store, job_id)
    again = await ops.complete(
        store, job_id, worker_id="j:attempt:1/1", attempt=1, known=(settled, now)
    )
    assert again.status == "terminal_state"
    assert await snapshot(store, job_id) == after


async def test_two_settles_racing_on_one_read_write_one_receipt(store: Store) -> None:
    job_id = await running(store)
    job, now = await read(store, job_id)
    results = await asyncio.gather(
        *(
            append_if_unchanged(store, job_id, job, completed(), now, lease_held=True)
            for _ in range(8)
        )
    )
    assert sum(r is not None for r in results) == 1
    assert (await types(store, job_id)).count("job.completed") == 1


async def test_an_append_a_policy_wants_takes_the_transaction(store: Store) -> None:
    objective_id = await create_objective(store, new_id("objective"))
    job = (await put(store, payload_extra={"objectiveId": objective_id})).job
    out = await ops.start_attempt(store, job.job_id, attempt=1, worker_id="w1", lease_ms=LEASE)
    assert out.ok
    current, now = await read(store, job.job_id)
    try:
        await append_if_unchanged(store, job.job_id, current, completed(), now, lease_held=True)
    except NeedsTransaction:
        pass
    else:
        raise AssertionError("the control outbox wants this settle: it must not be guarded")
    assert "job.completed" not in await types(store, job.job_id)
    # The operation takes the locked path and the objective hears of it in the same commit.
    done = await ops.complete(store, job.job_id, worker_id="w1", attempt=1, known=(current, now))
    assert done.ok
    objective = [r.type for r in await store.read_stream(f"objectives/{objective_id}")]
    assert objective[-1] == "objective.control_requested"


async def test_no_callback_url_no_outbox_row(db_url: str, store: Store) -> None:
    """A settle leaves its terminal callback owed only where a callback URL is configured
    (`owe_callbacks`, from the core settings): otherwise no row is written for nobody to post."""
    quiet = await Store.open(db_url, policies=(), owe_callbacks=False)
    try:
        for owing, via in ((True, store), (False, quiet)):
            job_id = await running(via)
            assert (await ops.complete(via, job_id, worker_id="w1", attempt=1)).ok
            _, _, owed = await snapshot(store, job_id)
            assert owed == (1 if owing else 0)
    finally:
        await quiet.close()


async def test_a_settle_naming_an_objective_that_does_not_exist_waits_on_no_lock(
    store: Store,
) -> None:
    """The control outbox locks an objective's stream only when the objective exists: a job
    whose `objectiveId` names none settles while another transaction holds that stream's lock."""
    missing = new_id("no-such-objective")
    job = (await put(store, payload_extra={"objectiveId": missing})).job
    out = await ops.start_attempt(store, job.job_id, attempt=1, worker_id="w1", lease_ms=LEASE)
    assert out.ok
    async with store.transaction() as holder:
        await holder.lock_key(f"stream:objectives/{missing}")
        done = await asyncio.wait_for(
            ops.complete(store, job.job_id, worker_id="w1", attempt=1), timeout=5
        )
    assert done.ok
    assert await store.read_stream(f"objectives/{missing}") == []
