"""Projections are derivable: the rebuilt jobs table equals the live one, row for row."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tracemalloc
from typing import Any

import psycopg
import pytest

from receipts import operations as ops
from receipts import projections
from receipts.assembly import rebuild, verify
from receipts.store import Store
from tests.integration.helpers import new_id, put


def rows(url: str) -> list[tuple[Any, ...]]:
    """Every job as a reader sees it: its row, with the heartbeat's lease row laid over the
    columns a heartbeat changes (migrations/0007_history.sql)."""
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT j.job_id, j.organization_id, j.session_key, j.agent_id, j.lane, j.kind, "
            "j.status, j.attempt, j.max_attempts, j.abort_requested, j.available_at, "
            "j.created_at, greatest(j.seq, l.seq), "
            "CASE WHEN l.seq > j.seq THEN l.expires_at ELSE j.lease_expires_at END, "
            "CASE WHEN l.seq > j.seq THEN j.state || l.patch ELSE j.state END "
            "FROM jobs j LEFT JOIN job_leases l ON l.job_id = j.job_id ORDER BY j.job_id"
        ).fetchall()


async def workload(store: Store) -> None:
    session = new_id("session")
    a = (await put(store, sessionKey=session)).job
    b = (await put(store, sessionKey=session, lane="chat")).job
    await ops.lease(store, b.job_id, attempt=1, worker_id="w", lease_ms=60_000)
    await ops.heartbeat(store, b.job_id, worker_id="w", attempt=1, lease_ms=60_000)
    await ops.add_command(
        store, b.job_id, type="follow_up", payload={"x": 1}, organization_id="org-a"
    )
    await put(store, sessionKey=session, singletonMode="cancel")
    await ops.lease(store, a.job_id, attempt=1, worker_id="w", lease_ms=60_000)
    c = (await put(store)).job
    await ops.lease(store, c.job_id, attempt=1, worker_id="w", lease_ms=60_000)
    await ops.fail(store, c.job_id, worker_id="w", attempt=1, error="e", retryable=True)


async def test_rebuilt_projection_equals_the_live_one_row_for_row(
    store: Store, db_url: str
) -> None:
    await workload(store)
    live = rows(db_url)
    assert live
    assert await verify(store) == []
    count = (await rebuild(store))["jobs"]
    assert count == len(live)
    assert rows(db_url) == live


async def test_verify_reports_a_tampered_projection(store: Store, db_url: str) -> None:
    job = (await put(store)).job
    with psycopg.connect(db_url) as conn:
        conn.execute(
            "UPDATE jobs SET state = jsonb_set(state, '{status}', '\"completed\"') "
            "WHERE job_id = %s",
            (job.job_id,),
        )
    problems = await verify(store)
    assert problems == [f"{job.job_id}: projection differs from the fold of its chain"]
    await rebuild(store)
    assert await verify(store) == []


async def test_verify_reports_a_row_whose_columns_left_its_state(store: Store, db_url: str) -> None:
    """The one-statement writes compute a job row's columns apart from its `state`: a column
    that disagrees (what the dispatcher and the leases read) was invisible to a verify that
    compared the state only. A heartbeat's row (its lease on the lease row) is no difference."""
    job = (await put(store)).job
    beating = (await put(store)).job
    await ops.lease(store, beating.job_id, attempt=1, worker_id="w", lease_ms=60_000)
    await ops.heartbeat(store, beating.job_id, worker_id="w", attempt=1, lease_ms=60_000)
    assert await verify(store) == []
    with psycopg.connect(db_url) as conn:
        conn.execute("UPDATE jobs SET status = 'completed' WHERE job_id = %s", (job.job_id,))
    problems = await verify(store)
    assert problems == [f"{job.job_id}: column status is 'completed', the fold's 'queued'"]
    await rebuild(store)
    assert await verify(store) == []


def test_cli_rebuild_and_verify(db_url: str) -> None:
    env = {"RECEIPT_DATABASE_URL": db_url, "PATH": "/usr/bin:/bin"}
    verify_run = subprocess.run(
        [sys.executable, "-m", "roles.cli.main", "rebuild-projections", "--verify-only"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert verify_run.returncode == 0, verify_run.stderr
    assert "projection differences: 0" in verify_run.stdout
    rebuild_run = subprocess.run(
        [sys.executable, "-m", "roles.cli.main", "rebuild-projections"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert rebuild_run.returncode == 0, rebuild_run.stderr
    assert "jobs projection rebuilt from the chain" in rebuild_run.stdout


async def test_a_verify_finds_the_differences_of_every_batch(
    fresh: tuple[Store, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chain is folded and compared a batch of streams at a time: a changed row, a missing
    one and one with no stream are each found whatever batch they fall in."""
    monkeypatch.setattr(projections, "FOLD_BATCH", 2)
    store, url = fresh
    ids = sorted([(await put(store)).job.job_id for _ in range(5)])
    with psycopg.connect(url) as conn:
        conn.execute(
            "UPDATE jobs SET state = jsonb_set(state, '{attempt}', '7') WHERE job_id = %s",
            (ids[3],),
        )
        conn.execute("DELETE FROM jobs WHERE job_id = %s", (ids[4],))
        conn.execute(
            "INSERT INTO jobs SELECT 'zz-no-stream', seq, organization_id, session_key, agent_id,"
            " lane, kind, status, attempt, max_attempts, abort_requested, available_at,"
            " lease_expires_at, last_heartbeat_at, created_at, updated_at,"
            " jsonb_set(state, '{jobId}', '\"zz-no-stream\"'), worker_queue"
            " FROM jobs WHERE job_id = %s",
            (ids[0],),
        )
    assert await verify(store) == [
        f"{ids[3]}: projection differs from the fold of its chain",
        f"{ids[4]}: in the chain but not in the projection",
        "zz-no-stream: in the projection but not in the chain",
    ]
    assert (await rebuild(store))["jobs"] == 5
    assert await verify(store) == []


async def peaks(store: Store, jobs: int) -> tuple[int, int]:
    """The peak of Python memory a verify and a rebuild took, each checked clean."""
    tracemalloc.start()
    try:
        assert await verify(store) == []
        verify_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        assert (await rebuild(store))["jobs"] == jobs
        return verify_peak, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


async def test_a_verify_and_a_rebuild_hold_one_batch_of_the_chain(
    fresh: tuple[Store, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both read every receipt of a kind: held whole, a million jobs' chain did not fit in the
    process. They hold a page of receipts and a batch of folded states, whatever the chain's
    length past a page: three times the jobs (of 20 KB each) take about the same memory (held
    whole: 3x)."""
    monkeypatch.setattr(projections, "FOLD_BATCH", 10, raising=False)
    store, _ = fresh
    for _ in range(200):
        await put(store, payload_extra={"note": "x" * 20_000})
    verify_200, rebuild_200 = await peaks(store, 200)
    for _ in range(400):
        await put(store, payload_extra={"note": "x" * 20_000})
    verify_600, rebuild_600 = await peaks(store, 600)
    assert verify_600 < 1.5 * verify_200, (verify_200, verify_600)
    assert rebuild_600 < 1.5 * rebuild_200, (rebuild_200, rebuild_600)


async def test_a_verify_takes_no_lock_and_reads_one_snapshot(fresh: tuple[Store, str]) -> None:
    """`--verify-only` took a share lock on `jobs`: every enqueue and settle waited for the
    whole verify (65 s at 360 000 receipts), while a heartbeat passed it and showed up as a
    difference. It reads one snapshot now: a writer holding the table goes on, the verify too."""
    store, url = fresh
    job = (await put(store)).job
    with psycopg.connect(url) as writer, writer.transaction():
        writer.execute("LOCK TABLE jobs IN ROW EXCLUSIVE MODE")  # an enqueue, not yet committed
        assert await asyncio.wait_for(verify(store), 10) == []
    assert await store.get_job(job.job_id) is not None


async def test_a_rebuild_waits_for_a_writer_that_read_its_row(fresh: tuple[Store, str]) -> None:
    """An objective's or a schedule's writer read its row with a plain SELECT under its stream
    lock, which a rebuild's table lock does not wait for: a writer that read before the rebuild
    wrote its stale state back after it (verify: 'projection differs'). Its read locks the row:
    the rebuild waits for its write."""
    from receipts.objectives import store as objectives
    from receipts.objectives.model import objective_stream
    from tests.integration.helpers import create_objective

    store, _ = fresh
    objective_id = await create_objective(store, "o-rebuild")
    async with store.transaction() as tx:
        await tx.lock_streams([objective_stream(objective_id)])
        assert await objectives.load(tx, objective_id) is not None
        rebuilding = asyncio.create_task(rebuild(store))
        await asyncio.sleep(1.0)
        assert not rebuilding.done()  # it waits on the writer's row lock
    assert (await asyncio.wait_for(rebuilding, 30))["objectives"] == 1
    assert await verify(store) == []


async def test_cli_verify_only_exits_1_when_it_finds_a_difference(
    fresh: tuple[Store, str],
) -> None:
    """`rebuild-projections --verify-only` says by its exit status whether a projection differs
    from the chain (1), as its help promises."""
    store, url = fresh
    job = (await put(store)).job
    with psycopg.connect(url) as conn:
        conn.execute("UPDATE jobs SET status = 'completed' WHERE job_id = %s", (job.job_id,))
    verify_run = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "roles.cli.main", "rebuild-projections", "--verify-only"],
        env={"RECEIPT_DATABASE_URL": url, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert verify_run.returncode == 1, verify_run.stderr
    assert "projection differences: 1" in verify_run.stdout
