"""The dispatcher's SQL and `receipts.plan.next_step` pick the same jobs (real PostgreSQL)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from receipts import assembly, deliveries, fairness
from receipts import operations as ops
from receipts.plan import Slots, Step, next_step
from receipts.settings import Settings
from receipts.store import Store
from roles.infra.db import migrate_url
from tests.integration.helpers import put

LEASE = 60_000


@pytest.fixture
async def store(make_database: Callable[[], str]) -> AsyncIterator[Store]:
    """A database of its own: the scans see only this test's jobs."""
    url = make_database()
    await migrate_url(url)
    store = await assembly.open_store(url, min_size=1, max_size=4)
    yield store
    await store.close()


async def test_the_rescan_sql_selects_exactly_the_jobs_the_plan_would_deliver(store: Store) -> None:
    fresh = (await put(store)).job
    later = (await put(store, delayMs=600_000)).job
    leased = (await put(store)).job
    assert (await ops.lease(store, leased.job_id, attempt=1, worker_id="w", lease_ms=LEASE)).ok
    done = (await put(store)).job
    assert (await ops.lease(store, done.job_id, attempt=1, worker_id="w", lease_ms=LEASE)).ok
    assert (await ops.complete(store, done.job_id, worker_id="w", attempt=1)).ok
    # Requeued after a retryable failure, once with an abort waiting for its next delivery.
    retried, aborted = (await put(store)).job, (await put(store)).job
    for job in (retried, aborted):
        assert (await ops.lease(store, job.job_id, attempt=1, worker_id="w", lease_ms=LEASE)).ok
    await ops.add_command(store, aborted.job_id, type="abort", organization_id="org-a")
    for job in (retried, aborted):
        out = await ops.fail(store, job.job_id, worker_id="w", attempt=1, error="x", retryable=True)
        assert out.job is not None and out.job.status == "queued"

    ids = [j.job_id for j in (fresh, later, leased, done, retried, aborted)]
    now = await store.now()
    steps = {i: next_step(await store.get_job(i), now) for i in ids}
    assert [steps[i].step for i in ids] == [
        Step.DELIVER,
        Step.NOT_AVAILABLE,
        Step.ACTIVE,
        Step.TERMINAL,
        Step.DELIVER,
        Step.ABORT,
    ]
    wanted = {i for i in ids if steps[i].needs_delivery}
    assert set((await deliveries.undelivered_queued(store)).job_ids) == wanted
    candidates = await deliveries.redrive_candidates(store, min_age_ms=0, cooldown_ms=0)
    assert set(candidates.job_ids) == wanted
    assert await deliveries.next_available_at(store) == steps[later.job_id].until


async def test_the_scans_share_each_queue_out_as_the_starter_would_oldest_first(
    store: Store,
) -> None:
    first = (await put(store, org="org-a")).job
    waiting = [(await put(store, org="org-a")).job for _ in range(3)]
    other = (await put(store, org="org-b")).job
    chat = (await put(store, agent="factory", kind="factory.run", org="org-a")).job
    # `first` holds a slot (its delivery is being started): it is never held back.
    taken = await fairness.claim(store, first, await store.now(), "receipt-codex", 1)
    assert taken.step is Step.DELIVER
    for cap in (1, 2, 3, 0):
        settings = Settings(RECEIPT_ORG_MAX_RUNNING_PER_GROUP=f"codex={cap}")
        now = await store.now()
        # What the starter would do, handed every queued job oldest first.
        held = {("org-a", "receipt-codex"): 1}
        wanted = {first.job_id}
        for job in [*waiting, other, chat]:
            share = fairness.share_of(job, settings)
            key = (job.organization_id, share[0] if share else "")
            slots = Slots(held.get(key, 0), share[1]) if share else None
            if next_step(job, now, slots=slots).needs_delivery:
                wanted.add(job.job_id)
                held[key] = held.get(key, 0) + 1
        caps = fairness.caps(settings)
        picked = (await deliveries.undelivered_queued(store, caps=caps)).job_ids
        assert set(picked) == wanted, cap
        candidates = await deliveries.redrive_candidates(
            store, min_age_ms=0, cooldown_ms=0, caps=caps
        )
        assert set(candidates.job_ids) == wanted, cap
        assert await fairness.held_back(store, settings) == 6 - len(wanted), cap
        if cap == 3:
            # Organizations interleave: org-b's one job before org-a's second waiting one.
            assert picked.index(other.job_id) < picked.index(waiting[1].job_id)
    assert len(wanted) == 6  # cap 0: nothing is held back
