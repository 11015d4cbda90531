"""Requests and passes do bounded work when one organization is much bigger than the others:
on a database of 60 000 jobs in three organizations (one of 50 000), 20 000 agent jobs, their
wakeups and a webhook backlog, seeded in SQL the shapes the store writes, no read here scans a
table that grows with the history, nor reads another organization's rows for a small one."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from receipts import assembly
from receipts.reads import JobFilters, failed_groups, job_counts
from receipts.sql import query
from roles.infra.db import migrate_url

SEED = """
INSERT INTO jobs (job_id, seq, organization_id, agent_id, lane, kind, status, attempt,
                  max_attempts, created_at, updated_at, state, worker_queue)
SELECT 'j' || g || '~' || o.tag, 3, o.org, 'codex', 'chat', 'codex', s.status, 1, 3,
       now() - make_interval(secs => (60000 - g) * 10), now() - make_interval(secs => (60000 - g) * 10),
       jsonb_build_object('jobId', 'j' || g || '~' || o.tag, 'status', s.status,
                          'error', CASE WHEN s.status = 'failed' THEN 'boom' END),
       'receipt-worker'
FROM generate_series(1, 60000) g
CROSS JOIN LATERAL (SELECT CASE WHEN g % 12 = 0 THEN 'org-small' WHEN g % 12 = 1 THEN 'org-mid'
                                ELSE 'org-big' END AS org,
                           CASE WHEN g % 12 = 0 THEN 'ts' WHEN g % 12 = 1 THEN 'tm'
                                ELSE 'tb' END AS tag) o
CROSS JOIN LATERAL (SELECT CASE WHEN g % 12 = 0 AND g % 600 <> 0 THEN 'completed'
                                WHEN g % 14 = 1 OR g % 600 = 0 THEN 'failed'
                                ELSE 'completed' END AS status) s;
INSERT INTO callback_posts (job_id, event, url, status, attempts, posted_at)
SELECT job_id, e, 'https://callbacks.example/hook', 'posted', 1, updated_at
FROM jobs CROSS JOIN (VALUES ('dispatched'), ('completed')) AS v(e);
INSERT INTO agent_jobs (agent_job_id, seq, organization_id, agent_id, owner_session_id,
                        source_tool_call_id, status, attempt, turn, consecutive_failures,
                        created_at, updated_at, state)
SELECT 'aj' || g || '~tb', 4, 'org-big', 'codex', 's' || (g % 500) || '~tb', 'call' || g,
       CASE WHEN g > 19990 THEN 'waiting_on_user' ELSE 'succeeded' END, 1, 1, 0,
       now() - make_interval(secs => (20000 - g) * 120),
       now() - make_interval(secs => (20000 - g) * 120), '{}'
FROM generate_series(1, 20000) g;
INSERT INTO agent_job_wakeups (source_id, agent_job_id, session_id, session_seq, created_at)
SELECT agent_job_id || ':' || k, agent_job_id, owner_session_id,
       (row_number() OVER (PARTITION BY owner_session_id ORDER BY updated_at, k))::int, updated_at
FROM agent_jobs CROSS JOIN generate_series(1, 3) k;
INSERT INTO webhooks (webhook_id, organization_id, url, events, secret)
VALUES ('wh-big', 'org-big', 'https://hooks.example/big', ARRAY['job.completed'], 'whsec_x');
-- The deliveries of its jobs, and a backlog of 3 000 at the big organization's dead endpoint.
INSERT INTO webhook_deliveries (webhook_id, organization_id, event, event_key, subject, status,
                                next_try_at)
SELECT 'wh-big', 'org-big', 'job.completed', job_id, job_id,
       CASE WHEN updated_at > now() - interval '12 hours' THEN 'pending' ELSE 'delivered' END,
       now() + interval '10 minutes'
FROM jobs WHERE organization_id = 'org-big';
"""


@dataclass(frozen=True)
class Organization:
    """A viewer of one organization (receipts.reads.Viewer)."""

    organization_id: str
    admin: bool = False


@pytest.fixture(scope="module")
async def seeded(make_database: Callable[[], str]) -> AsyncIterator[str]:
    url = make_database()
    await migrate_url(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SEED.encode())
        conn.execute(query("tooling_vacuum_analyze").encode())
    yield url


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def analyzed(url: str, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes of EXPLAIN (ANALYZE, FORMAT JSON) of the named statement (rolled back)."""
    with psycopg.connect(url) as conn:
        conn.execute("SET jit = off")
        row = conn.execute(
            b"EXPLAIN (ANALYZE, FORMAT JSON) " + query(name).encode(), params
        ).fetchone()
        conn.rollback()
    assert row is not None
    return list(nodes(row[0][0]["Plan"]))


def read_of(plan: list[dict[str, Any]], relation: str) -> int:
    """Rows of `relation` the plan read: returned plus removed by a filter, over every loop."""
    return sum(
        (n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0)) * n.get("Actual Loops", 1)
        for n in plan
        if n.get("Relation Name") == relation
    )


def seq_scans(plan: list[dict[str, Any]]) -> list[str]:
    return [n["Relation Name"] for n in plan if n["Node Type"] == "Seq Scan"]


async def test_the_big_organizations_failed_groups_and_retry_read_its_failed_jobs(
    seeded: str,
) -> None:
    """The console's failed groups and a bulk retry's candidates of an organization read its
    failed jobs (jobs_retryable_idx), not every job: the index they named went in 0007."""
    groups = analyzed(
        seeded,
        "console_failed_groups",
        {
            "all_organizations": False,
            "caller_organization_id": "org-big",
            "agent_id": None,
            "window": 10_000,
            "limit": 20,
        },
    )
    assert "jobs" not in seq_scans(groups), groups
    retry = analyzed(
        seeded,
        "retry_candidates",
        {
            "status": "failed",
            "organization_id": "org-big",
            "agent_id": None,
            "kind": None,
            "lane": None,
            "error": None,
            "tried": [],
            "limit": 100,
        },
    )
    assert "jobs" not in seq_scans(retry), retry
    assert read_of(retry, "jobs") <= 5_000, retry  # the big organization has about 4 000 failed


async def test_console_counts_never_run_a_generic_plan_over_other_organizations(
    seeded: str,
) -> None:
    """A console page's counts (called through a pool connection again and again) are never a
    prepared statement: its generic plan cannot use the organization's filter, and walked every
    organization's jobs for a small one (a quarter of a second at 300 000 jobs)."""
    store = await assembly.open_store(seeded, min_size=1, max_size=1)
    viewer = Organization("org-small")
    try:
        for _ in range(8):
            await job_counts(store, viewer, JobFilters())
            await failed_groups(store, viewer, None, 20)
        async with store.connection() as conn:
            cur = await conn.execute("SELECT statement FROM pg_prepared_statements")
            prepared = [row[0] for row in await cur.fetchall()]
    finally:
        await store.close()
    assert not [s for s in prepared if "FROM jobs" in s], prepared


async def test_a_retention_batch_probes_each_agent_jobs_pending_deliveries(seeded: str) -> None:
    """Whether a turn of an agent job owes a webhook delivery is a probe of the turns' range,
    not a read of every pending delivery of its organization per agent job of the batch (a
    backlog of 3 000 at a dead endpoint read 200 times was 600 000 rows)."""
    plan = analyzed(
        seeded,
        "prune_agent_candidates",
        {
            "cutoff": datetime.now(UTC) - timedelta(hours=1),
            "batch": 200,
            "after_updated_at": datetime(1970, 1, 1, tzinfo=UTC),
            "after_job_id": "",
            "callback_urls": [],
        },
    )
    # What the batch reads per agent job (every node run once per agent job: the probes, and
    # a materialized set read again each time): a few rows each, not the backlog each.
    per_agent_job = sum(
        (n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"]
        for n in plan
        if n.get("Actual Loops", 1) > 1
    )
    assert per_agent_job <= 5_000, plan


async def test_the_wakeup_redrive_reads_the_days_wakeups_only(seeded: str) -> None:
    """`agent_wakeups_unposted` (each dispatcher pass, per callback URL) reads the wakeups of
    the last day through their time, and probes callback_posts by key: neither table is
    scanned (callback_posts holds every job's callbacks)."""
    plan = analyzed(
        seeded, "agent_wakeups_unposted", {"url": "https://callbacks.example/hook", "limit": 100}
    )
    assert not {"agent_job_wakeups", "callback_posts"} & set(seq_scans(plan)), plan


async def test_the_open_agent_job_count_reads_the_open_ones(seeded: str) -> None:
    """The cap's count at each agent job create reads the organization's unfinished agent
    jobs, not its whole history of them."""
    plan = analyzed(seeded, "agent_jobs_open_count", {"organization_id": "org-big", "cap": 100})
    assert read_of(plan, "agent_jobs") <= 100, plan
