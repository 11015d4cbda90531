"""The per-organization open-job counters (migration 0009) that the API's caps read: after every
kind of status change, under concurrent writers, through a projection rebuild, retention and the
migration's own backfill, they equal the count of the jobs rows; and the caps they feed still
refuse an organization's posts beyond its cap when the posts come at once."""

from __future__ import annotations

import asyncio

import psycopg

from receipts import assembly
from receipts import operations as ops
from receipts.sql import migrations
from receipts.store import Store
from tests.integration.api_support import api_client, enqueue_body
from tests.integration.helpers import new_id, put

# Every organization whose counters disagree with its rows: (org, counted, actual) with
# (queued, active) pairs. Read in one snapshot.
DISAGREEING = """
WITH counted AS (
    SELECT organization_id, sum(queued) AS queued, sum(active) AS active
    FROM org_open_jobs GROUP BY organization_id
), actual AS (
    SELECT organization_id, count(*) FILTER (WHERE status = 'queued') AS queued,
           count(*) AS active
    FROM jobs
    WHERE organization_id IS NOT NULL AND status IN ('queued', 'leased', 'running')
    GROUP BY organization_id
)
SELECT organization_id, coalesce(c.queued, 0), coalesce(c.active, 0),
       coalesce(a.queued, 0), coalesce(a.active, 0)
FROM counted c FULL JOIN actual a USING (organization_id)
WHERE coalesce(c.queued, 0) <> coalesce(a.queued, 0)
   OR coalesce(c.active, 0) <> coalesce(a.active, 0)
"""


def disagreeing(url: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(DISAGREEING.encode()).fetchall()


async def open_counts(store: Store, org: str) -> tuple[int, int]:
    """(queued, active) as the API's cap check reads them."""
    row = await store.fetch_one("enqueue_caps", {"organization_id": org})
    assert row is not None
    return int(row[1]), int(row[2])


async def test_the_counts_follow_every_status_change(store: Store, db_url: str) -> None:
    org = new_id("org")
    assert await open_counts(store, org) == (0, 0)
    a, b, c, d = [(await put(store, org=org)).job for _ in range(4)]
    assert await open_counts(store, org) == (4, 4)
    # queued → running (leased and first heartbeat in one append)
    await ops.start_attempt(store, a.job_id, attempt=1, worker_id="w", lease_ms=60_000)
    assert await open_counts(store, org) == (3, 4)
    # queued → leased; a heartbeat (leased → running) changes neither count
    await ops.lease(store, b.job_id, attempt=1, worker_id="w", lease_ms=60_000)
    await ops.heartbeat(store, b.job_id, worker_id="w", attempt=1, lease_ms=60_000)
    assert await open_counts(store, org) == (2, 4)
    # running → completed
    await ops.complete(store, a.job_id, worker_id="w", attempt=1, result=1)
    assert await open_counts(store, org) == (2, 3)
    # running → queued again (a retryable failure with attempts left)
    await ops.fail(store, b.job_id, worker_id="w", attempt=1, error="e", retryable=True)
    assert await open_counts(store, org) == (3, 3)
    # queued → canceled
    await ops.cancel_queued(store, c.job_id, reason="r")
    assert await open_counts(store, org) == (2, 2)
    # a steer absorbed by the active job adds no job
    session = new_id("session")
    s = (await put(store, org=org, sessionKey=session)).job
    await put(store, org=org, sessionKey=session, singletonMode="steer")
    assert await open_counts(store, org) == (3, 3)
    # a singleton cancel: the old job leaves, the new one comes, in one transaction
    await put(store, org=org, sessionKey=session, singletonMode="cancel")
    canceled = await store.get_job(s.job_id)
    assert canceled is not None and canceled.status == "canceled"
    assert await open_counts(store, org) == (3, 3)
    assert d.status == "queued"
    assert disagreeing(db_url) == []


async def test_the_counts_hold_under_concurrent_writers(store: Store, db_url: str) -> None:
    org = new_id("org")
    first = [(await put(store, org=org)).job for _ in range(20)]

    async def settle(job_id: str) -> None:
        await ops.start_attempt(store, job_id, attempt=1, worker_id="w", lease_ms=60_000)
        await ops.complete(store, job_id, worker_id="w", attempt=1, result=None)

    async def enqueue() -> None:
        await put(store, org=org)

    await asyncio.gather(
        *(settle(job.job_id) for job in first[:15]),
        *(enqueue() for _ in range(30)),
    )
    assert await open_counts(store, org) == (35, 35)
    assert disagreeing(db_url) == []


async def test_a_projection_rebuild_and_retention_keep_the_counts(
    fresh: tuple[Store, str],
) -> None:
    store, url = fresh
    org = new_id("org")
    jobs = [(await put(store, org=org)).job for _ in range(5)]
    await ops.start_attempt(store, jobs[0].job_id, attempt=1, worker_id="w", lease_ms=60_000)
    await ops.start_attempt(store, jobs[1].job_id, attempt=1, worker_id="w", lease_ms=60_000)
    await ops.complete(store, jobs[1].job_id, worker_id="w", attempt=1, result=None)
    assert await open_counts(store, org) == (3, 4)
    await assembly.rebuild(store)
    assert await open_counts(store, org) == (3, 4)
    with psycopg.connect(url) as conn:
        # A settled job's row goes (as retention deletes it): no count changes. An open job's
        # row goes: its counts go with it.
        conn.execute("DELETE FROM jobs WHERE job_id = %s", (jobs[1].job_id,))
        conn.execute("DELETE FROM jobs WHERE job_id = %s", (jobs[2].job_id,))
    assert await open_counts(store, org) == (2, 3)
    assert disagreeing(url) == []


async def test_the_migration_counts_the_jobs_already_there(fresh: tuple[Store, str]) -> None:
    store, url = fresh
    org, other = new_id("org"), new_id("org")
    jobs = [(await put(store, org=org)).job for _ in range(3)]
    await put(store, org=other)
    await ops.start_attempt(store, jobs[0].job_id, attempt=1, worker_id="w", lease_ms=60_000)
    (migration,) = [m for m in migrations() if m.name == "org_open_counts"]
    with psycopg.connect(url) as conn:
        # As before the migration: no counters (the rows are what the backfill must count).
        conn.execute("DELETE FROM org_open_jobs")
        conn.execute(migration.sql.encode())
    assert await open_counts(store, org) == (2, 3)
    assert await open_counts(store, other) == (1, 1)
    assert disagreeing(url) == []
    with psycopg.connect(url) as conn:
        conn.execute("TRUNCATE jobs")
    assert await open_counts(store, org) == (0, 0)
    assert disagreeing(url) == []


async def test_the_queued_cap_refuses_posts_that_come_at_once(db_url: str) -> None:
    """The check reads the counters first in the enqueue's transaction, before its write
    commits, so posts racing each other may each find room: the cap can be passed by at most
    the posts in flight, never more, and once it is reached every further post is refused."""
    org = new_id("org")
    cap, clients = 20, 8
    async with api_client(db_url, tokens=f"token-{org} {org}", org_max_queued=cap) as c:
        headers = {"Authorization": f"Bearer token-{org}"}
        statuses: list[int] = []

        async def client() -> None:
            for _ in range(10):
                response = await c.post(
                    "/agents/codex/jobs", json=enqueue_body(org=org), headers=headers
                )
                statuses.append(response.status_code)

        await asyncio.gather(*(client() for _ in range(clients)))
        accepted = statuses.count(202)
        assert set(statuses) == {202, 429}
        assert cap <= accepted <= cap + clients - 1
        late = await c.post("/agents/codex/jobs", json=enqueue_body(org=org), headers=headers)
        assert late.status_code == 429
