"""The dispatcher's SQL and `receipts.plan.next_step` pick the same jobs (real PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable

from receipts import deliveries
from receipts import operations as ops
from receipts.plan import Step, next_step
from receipts.store import Store
from roles.infra.db import migrate_url
from tests.integration.helpers import put

LEASE = 60_000


async def test_the_rescan_sql_selects_exactly_the_jobs_the_plan_would_deliver(
    make_database: Callable[[], str],
) -> None:
    url = make_database()
    await migrate_url(url)
    store = await Store.open(url, min_size=1, max_size=4)
    try:
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
            out = await ops.fail(
                store, job.job_id, worker_id="w", attempt=1, error="x", retryable=True
            )
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
        assert set(await deliveries.undelivered_queued(store)) == wanted
        candidates = await deliveries.redrive_candidates(store, min_age_ms=0, cooldown_ms=0)
        assert {job_id for job_id, _, _ in candidates} == wanted
        assert await deliveries.next_available_at(store) == steps[later.job_id].until
    finally:
        await store.close()
