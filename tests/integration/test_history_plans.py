"""Every periodic query reads active work only: on a database holding 60 000 finished jobs (360 000
receipts), enough that the planner chooses honestly, none of them scans a history table, and a
heartbeat leaves the jobs row alone and updates its lease row HOT."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from receipts import assembly
from receipts import operations as ops
from receipts.sql import query
from receipts.store import Store
from roles.infra.db import migrate_url
from tests.integration.helpers import put
from tools.bench.history import LISTS, PERIODIC, add_active, list_params, preload, run_template

FINISHED = 60_000
# Tables that grow with every job ever run: a periodic query must reach them by index only.
HISTORY_TABLES = {
    "jobs",
    "receipts",
    "deliveries",
    "delivery_redrives",
    "callback_posts",
    "workflow_runs",
    "activity_runs",
}
# The Factory's objective scan reads its objectives table (docs/design.md §10); it is not this
# module's query.
NOT_OURS = {"objective_streams"}


@pytest.fixture(scope="module")
async def loaded(make_database: Callable[[], str]) -> AsyncIterator[tuple[Store, str]]:
    url = make_database()
    await migrate_url(url)
    store = await assembly.open_store(url, min_size=2, max_size=10)
    template = await run_template(store)
    await add_active(store, 40)
    await preload(store, template, FINISHED, age_s=3_600.0)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(query("tooling_vacuum_analyze").encode())
    yield store, url
    await store.close()


def scans(plan: dict[str, Any]) -> Iterator[tuple[str, str | None, str | None]]:
    """(node type, relation, index) of every node of an EXPLAIN (FORMAT JSON) plan."""
    yield plan["Node Type"], plan.get("Relation Name"), plan.get("Index Name")
    for child in plan.get("Plans", []):
        yield from scans(child)


def plan_of(
    url: str, name: str, params: dict[str, Any]
) -> list[tuple[str, str | None, str | None]]:
    with psycopg.connect(url) as conn:
        conn.execute("SET jit = off")
        cutoff = conn.execute("SELECT now() - %s::interval", (timedelta(days=30),)).fetchone()
        assert cutoff is not None
        row = conn.execute(
            b"EXPLAIN (FORMAT JSON) " + query(name).encode(), {"cutoff": cutoff[0], **params}
        ).fetchone()
    assert row is not None
    return list(scans(row[0][0]["Plan"]))


PERIODIC_QUERIES = [(n, p) for n, p in PERIODIC.values() if n not in NOT_OURS] + [
    ("api_list_jobs", list_params(**filters)) for filters in LISTS.values()
]


@pytest.mark.parametrize(("name", "params"), PERIODIC_QUERIES, ids=lambda v: str(v)[:40])
async def test_no_periodic_query_scans_a_history_table(
    loaded: tuple[Store, str], name: str, params: dict[str, Any]
) -> None:
    _, url = loaded
    nodes = plan_of(url, name, params)
    sequential = [rel for node, rel, _ in nodes if node == "Seq Scan" and rel in HISTORY_TABLES]
    assert sequential == [], nodes


async def test_queue_depth_counts_through_the_active_partial_index(
    loaded: tuple[Store, str],
) -> None:
    _, url = loaded
    nodes = plan_of(url, "jobs_by_status", {})
    assert any(index == "jobs_active_status_idx" for _, _, index in nodes), nodes


async def test_the_oldest_queued_age_reads_the_queued_partial_index(
    loaded: tuple[Store, str],
) -> None:
    _, url = loaded
    nodes = plan_of(url, "queued_oldest_age", {})
    # Either partial index of the active set will do; the planner picks by their sizes.
    active_indexes = {"jobs_queued_idx", "jobs_active_status_idx"}
    assert any(index in active_indexes for _, _, index in nodes), nodes
    assert not [rel for node, rel, _ in nodes if node == "Seq Scan" and rel in HISTORY_TABLES]


async def test_heartbeats_update_the_lease_row_hot_and_leave_the_jobs_row(
    make_database: Callable[[], str],
) -> None:
    url = make_database()
    await migrate_url(url)
    store = await assembly.open_store(url, min_size=1, max_size=4)
    try:
        job = (await put(store)).job
        worker = f"{job.job_id}:attempt:1/1"
        await ops.start_attempt(store, job.job_id, attempt=1, worker_id=worker, lease_ms=60_000)
        for _ in range(40):
            out = await ops.heartbeat(
                store, job.job_id, worker_id=worker, attempt=1, lease_ms=60_000
            )
            assert out.ok
        done = await ops.complete(store, job.job_id, worker_id=worker, attempt=1, result=1)
        assert done.ok and done.job is not None and done.job.seq == 44
    finally:
        await store.close()  # a backend reports its table counters when it exits
    stats: dict[str, tuple[int, int]] = {}
    for _ in range(100):  # the exiting backends report asynchronously
        with psycopg.connect(url) as conn:
            rows = conn.execute(query("table_update_stats").encode()).fetchall()
            leases = conn.execute("SELECT count(*) FROM job_leases").fetchone()
        stats = {r[0]: (r[1], r[2]) for r in rows}
        if stats.get("jobs", (0, 0))[0] >= 2 and stats.get("job_leases", (0, 0))[0] >= 39:
            break
        await asyncio.sleep(0.1)
    # The jobs row: the lease (with its first heartbeat) and the settlement only.
    assert stats["jobs"][0] == 2
    # The lease row: inserted by the first heartbeat, updated by the other 39, in place (HOT)
    # but for the odd update whose page still held a version another snapshot could see.
    updates, hot = stats["job_leases"]
    assert updates == 39 and hot >= 0.9 * updates
    assert leases == (0,)  # the settlement ended the lease


async def test_a_prune_reads_an_objectives_jobs_by_their_key_range(
    loaded: tuple[Store, str],
) -> None:
    """`objective_jobs` (every retention batch that takes objectives, the dry run, the export)
    finds each objective's jobs through its key range (jobs_id_bytewise_idx), not by a scan of
    every job ever run."""
    _, url = loaded
    ids = [f"plan-o{n}~t" for n in range(10)]
    with psycopg.connect(url, autocommit=True) as conn:
        for objective_id in ids:
            conn.execute(
                "INSERT INTO objectives (objective_id, organization_id, seq, status, phase, title,"
                " created_at, updated_at, state) VALUES (%s, 'org-a', 1, 'completed', 1, 't',"
                " now(), now(), '{}') ON CONFLICT DO NOTHING",
                (objective_id,),
            )
        conn.execute("ANALYZE objectives")
    plan = plan_of(url, "objective_jobs", {"objective_ids": ids})
    assert not [s for s in plan if s[0] == "Seq Scan" and s[1] == "jobs"], plan
    assert ("Index Scan", "jobs", "jobs_id_bytewise_idx") in plan, plan


@pytest.mark.parametrize("name", ["agent_turn_jobs", "agent_turn_job_ids"])
async def test_a_prune_reads_agent_jobs_turns_by_their_key_range(
    loaded: tuple[Store, str], name: str
) -> None:
    """`agent_turn_jobs` (every retention batch that takes agent jobs) and `agent_turn_job_ids`
    (the export) find each agent job's turns through its key range (jobs_id_bytewise_idx). A
    join of the ids with jobs was planned as a nested loop comparing every job with every id:
    36 s for a batch of 1 000 agent jobs at 200 000 jobs, under the batch's locks."""
    _, url = loaded
    plan = plan_of(url, name, {"agent_job_ids": [f"plan-a{n}" for n in range(1_000)]})
    assert not [s for s in plan if s[0] == "Seq Scan" and s[1] == "jobs"], plan
    assert ("Index Scan", "jobs", "jobs_id_bytewise_idx") in plan or (
        "Index Only Scan",
        "jobs",
        "jobs_id_bytewise_idx",
    ) in plan, plan
