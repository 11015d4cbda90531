"""The refill after a settle reads the slots it frees, not the organization's whole backlog.

Every settle of a capped organization's job runs `dispatch_freed` (receipts/fairness.py `freed`):
its oldest waiting jobs, as many as its free slots. Its limit (`cap - held`) is not known when
the statement is planned, and PostgreSQL then plans for a tenth of the rows: on an analyzed
database with history, the backlog of one organization was read and sorted in full at every settle
of that organization (5 000 jobs: 5 001 rows read; 10 000 in a 200 000-job table: 7.5–10 ms a
settle, 35 ms on the roles' own database, never analyzed), so draining a backlog cost its size
per job drained."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import psycopg

from receipts import assembly, fairness
from receipts.settings import Settings
from receipts.sql import query
from receipts.store import Store
from roles.infra.db import migrate_url
from tests.integration.test_bounded_reads import nodes, read_of

SEED = """
INSERT INTO jobs (job_id, seq, organization_id, agent_id, lane, kind, status, attempt,
                  max_attempts, created_at, updated_at, state, worker_queue)
SELECT 'h' || g, 3, CASE WHEN g % 3 = 0 THEN 'org-small' ELSE 'org-big' END, 'chatty', 'chat',
       'factory.task.run', 'completed', 1, 3, now() - make_interval(secs => 200000 - g), now(),
       '{}', 'receipt-chat'
FROM generate_series(1, 60000) g;
"""
# One organization's backlog on the chat queue (its share there is capped at 12).
BACKLOG_SEED = """
INSERT INTO jobs (job_id, seq, organization_id, agent_id, lane, kind, status, attempt,
                  max_attempts, created_at, updated_at, state, worker_queue)
SELECT 'q' || lpad(g::text, 5, '0'), 1, 'org-big', 'chatty', 'chat', 'factory.task.run',
       'queued', 0, 3, now() - make_interval(secs => 10000 - g), now(), '{}', 'receipt-chat'
FROM generate_series(1, 5000) g;
"""


class Recording:
    """A store that keeps the parameters of every statement it runs."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.params: dict[str, Mapping[str, Any]] = {}

    async def fetch(self, name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        self.params[name] = params
        return await self.store.fetch(name, params)


def explained(url: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The nodes of EXPLAIN (ANALYZE, FORMAT JSON) of `dispatch_freed` with `params`."""
    with psycopg.connect(url) as conn:
        conn.execute("SET jit = off")
        row = conn.execute(
            b"EXPLAIN (ANALYZE, FORMAT JSON) " + query("dispatch_freed").encode(), params
        ).fetchone()
        conn.rollback()
    assert row is not None
    return list(nodes(row[0][0]["Plan"]))


async def test_a_settle_reads_the_freed_slots_not_the_organizations_backlog(
    make_database: Callable[[], str],
) -> None:
    url = make_database()
    await migrate_url(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SEED.encode())
        conn.execute(BACKLOG_SEED.encode())
        conn.execute(query("tooling_vacuum_analyze").encode())
    store = await assembly.open_store(url, min_size=1, max_size=2)
    try:
        recording = Recording(store)
        # h1 is a settled job of org-big, whose share of the chat queue is capped at 12.
        freed = await fairness.freed(recording, "h1", Settings())  # type: ignore[arg-type]
    finally:
        await store.close()
    assert freed == [f"q{n:05d}" for n in range(1, 13)]  # its 12 oldest, oldest first
    plan = explained(url, recording.params["dispatch_freed"])
    scans = [(n["Node Type"], n.get("Index Name"), n.get("Actual Rows")) for n in plan]
    assert read_of(plan, "jobs") <= 50, scans
