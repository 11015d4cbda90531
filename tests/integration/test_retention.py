"""Retention on real PostgreSQL: `receipt prune` removes exactly the terminal jobs settled before
the cutoff with every row that belongs to them, races live work without losing any, and the
RECEIPT_RETENTION loop runs in one process at a time."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from receipts import assembly, bookkeeping, deliveries, durations, metrics, retention
from receipts import operations as ops
from receipts.enqueue import enqueue, parse_enqueue
from receipts.errors import InvalidInput, ReceiptError
from receipts.jobs import Job
from receipts.settings import SettingsError
from receipts.sql import query
from receipts.store import Store
from receipts.tenancy import scoped_id
from roles.delivery.retention import RetentionLoop
from roles.infra.db import migrate_url
from roles.infra.settings import LoopSettings
from roles.infra.settings import load as load_settings
from tests.conftest import ROOT
from tests.integration.api_support import AS_ADMIN, api_client
from tests.integration.helpers import body, create_objective, put
from tools.bench.history import preload, run_template

AUDIT_KIND = "factory.objective.audit"
MONTH = timedelta(days=30)
OLD = "40 days"
# (table, column holding the job's key, how the key is made from the job id)
TABLES: tuple[tuple[str, str, str], ...] = (
    ("jobs", "job_id", "{}"),
    ("receipts", "stream", "jobs/{}"),
    ("deliveries", "job_id", "{}"),
    ("delivery_redrives", "job_id", "{}"),
    ("callback_posts", "job_id", "{}"),
    ("callback_outbox", "job_id", "{}"),
    ("webhook_deliveries", "subject", "{}"),
    ("workflow_runs", "job_id", "{}"),
    ("activity_runs", "job_id", "{}"),
    ("job_leases", "job_id", "{}"),
)


def backdate(url: str, job_ids: list[str]) -> None:
    """Make jobs look settled (or last changed) 40 days ago."""
    with psycopg.connect(url) as conn:
        conn.execute(
            f"UPDATE jobs SET updated_at = updated_at - interval '{OLD}' WHERE job_id = ANY(%s)",
            (job_ids,),
        )


def rows_of(url: str, job_ids: list[str]) -> dict[str, dict[str, int]]:
    """Rows per table per job."""
    out: dict[str, dict[str, int]] = {}
    with psycopg.connect(url) as conn:
        for table, column, key in TABLES:
            out[table] = {
                job_id: conn.execute(
                    f"SELECT count(*) FROM {table} WHERE {column} = %s", (key.format(job_id),)
                ).fetchone()[0]  # type: ignore[index]
                for job_id in job_ids
            }
    return out


async def finished(store: Store, how: str) -> Job:
    """A job settled `how` (completed / failed / canceled) with delivery, callback and ledger
    rows beside it, as a delivered job has."""
    job = (await put(store)).job
    if how == "canceled":
        await ops.cancel_queued(store, job.job_id, reason="test")
    else:
        worker = f"{job.job_id}:attempt:1/1"
        await ops.start_attempt(store, job.job_id, attempt=1, worker_id=worker, lease_ms=60_000)
        await ops.heartbeat(store, job.job_id, worker_id=worker, attempt=1, lease_ms=60_000)
        if how == "completed":
            await ops.complete(store, job.job_id, worker_id=worker, attempt=1, result={"ok": 1})
        else:
            await ops.fail(
                store, job.job_id, worker_id=worker, attempt=1, error="boom", retryable=False
            )
    await with_delivery_rows(store, job.job_id)
    final = await store.get_job(job.job_id)
    assert final is not None and final.status == how
    return final


async def with_delivery_rows(store: Store, job_id: str) -> None:
    await deliveries.record(store, job_id, 0)
    await deliveries.claim_redrive(store, job_id, 1, 0, cooldown_ms=0)
    await deliveries.claim_callback(store, job_id, "completed", "http://127.0.0.1:9/cb")
    deliveries.ledger_workflow(
        store,
        workflow_id=job_id,
        run_id="run-1",
        job_id=job_id,
        kind="factory.task.run",
        temporal_type="driver",
        task_queue="q",
        status="completed",
    )
    deliveries.ledger_activity(
        store,
        workflow_id=job_id,
        activity_id="attempt:1",
        attempt=1,
        job_id=job_id,
        kind="factory.task.run",
        activity="execute_attempt",
        worker_id="w",
        status="completed",
    )
    await bookkeeping.writer(store).flush()
    await callback_posted(store, job_id)


async def callback_posted(store: Store, job_id: str) -> None:
    """The job's terminal callback was posted (or no URL is configured): nothing is owed, as
    the redrive leaves it (a settle writes the outbox row; retention keeps a job while it is
    there)."""
    async with store.connection() as conn:
        await conn.execute("DELETE FROM callback_outbox WHERE job_id = %s", (job_id,))


async def running(store: Store) -> Job:
    job = (await put(store)).job
    worker = f"{job.job_id}:attempt:1/1"
    await ops.start_attempt(store, job.job_id, attempt=1, worker_id=worker, lease_ms=60_000)
    await ops.heartbeat(store, job.job_id, worker_id=worker, attempt=1, lease_ms=60_000)
    out = await ops.heartbeat(store, job.job_id, worker_id=worker, attempt=1, lease_ms=60_000)
    assert out.ok and out.job is not None
    return out.job


async def test_prune_removes_exactly_the_old_terminal_jobs_with_every_row_of_theirs(
    fresh: tuple[Store, str],
) -> None:
    store, url = fresh
    old = [await finished(store, how) for how in ("completed", "failed", "canceled")]
    old_queued = (await put(store)).job
    old_running = await running(store)
    await with_delivery_rows(store, old_queued.job_id)
    new = await finished(store, "completed")
    backdate(url, [j.job_id for j in (*old, old_queued, old_running)])
    kept_ids = [old_queued.job_id, old_running.job_id, new.job_id]
    old_ids = [j.job_id for j in old]
    before = rows_of(url, old_ids + kept_ids)
    assert all(before[t][i] > 0 for t in ("jobs", "receipts", "deliveries") for i in old_ids)
    assert before["job_leases"][old_running.job_id] == 1  # its heartbeat lives there

    dry = await retention.prune(store, MONTH, batch=2, dry_run=True)
    assert rows_of(url, old_ids + kept_ids) == before  # a dry run writes nothing
    exported = [line async for line in retention.export(store, MONTH, batch=2)]

    result = await retention.prune(store, MONTH, batch=2)

    expected = {t: sum(before[t][i] for i in old_ids) for t, _, _ in TABLES}
    assert result.removed == {t: n for t, n in expected.items()}
    assert dry.removed == result.removed
    assert result.jobs == 3 and result.batches == 2
    assert sorted(e["jobId"] for e in exported) == sorted(old_ids)
    assert all(
        [r["seq"] for r in e["receipts"]] == list(range(1, before["receipts"][e["jobId"]] + 1))
        for e in exported
    )
    after = rows_of(url, old_ids + kept_ids)
    assert all(after[t][i] == 0 for t, _, _ in TABLES for i in old_ids)
    assert all(after[t][i] == before[t][i] for t, _, _ in TABLES for i in kept_ids)
    # The projection is the fold of what is left, but for the column this test backdated on the
    # two kept jobs (a verify compares the columns too).
    tampered = {old_queued.job_id, old_running.job_id}
    differences = await assembly.verify(store)
    assert {d.split(":", 1)[0] for d in differences} <= tampered, differences
    assert all(": column updated_at is " in d for d in differences), differences

    async with api_client(url, store=store) as client:  # an admin names runtime ids
        assert (await client.get(f"/jobs/{old[0].job_id}", headers=AS_ADMIN)).status_code == 404
        assert (await client.get(f"/jobs/{new.job_id}", headers=AS_ADMIN)).status_code == 200
        assert (await client.get(f"/jobs/{old_queued.job_id}", headers=AS_ADMIN)).status_code == 200

    again = await retention.prune(store, MONTH, batch=2)
    assert again.jobs == 0 and sum(again.removed.values()) == 0
    assert rows_of(url, old_ids + kept_ids) == after


async def test_a_job_that_still_owes_its_callback_is_kept_until_it_is_posted(
    fresh: tuple[Store, str],
) -> None:
    store, url = fresh
    owing, settled = [await finished(store, "completed") for _ in range(2)]
    backdate(url, [owing.job_id, settled.job_id])
    with psycopg.connect(url) as conn:  # a callback URL was down for longer than the retention
        conn.execute(
            "INSERT INTO callback_outbox (job_id, event) VALUES (%s, 'completed')", (owing.job_id,)
        )
    dry = await retention.prune(store, MONTH, dry_run=True)
    result = await retention.prune(store, MONTH)
    assert dry.jobs == result.jobs == 1
    assert await store.get_job(settled.job_id) is None
    assert await store.get_job(owing.job_id) is not None
    with psycopg.connect(url) as conn:  # posted (or given up): the outbox row is gone
        conn.execute("DELETE FROM callback_outbox WHERE job_id = %s", (owing.job_id,))
    assert (await retention.prune(store, MONTH)).jobs == 1
    assert await store.get_job(owing.job_id) is None


async def test_a_prune_racing_live_enqueues_and_settlements_loses_nothing(
    fresh: tuple[Store, str],
) -> None:
    store, url = fresh
    template = await run_template(store)
    await preload(store, template, 600, age_s=45 * 86_400.0)
    preloaded = [f"{template}-{n}" for n in range(1, 601)]
    live: list[Job] = []
    late_refusals: list[str] = []

    async def worker(n: int) -> None:
        for _ in range(n):
            live.append(await finished(store, "completed"))
            live.append(await running(store))
            live.append((await put(store)).job)

    async def late_writer() -> None:
        # Settled jobs still get late writes (a stalled worker's heartbeat): under the row lock,
        # the same lock the prune skips.
        for job_id in preloaded[::7]:
            try:
                out = await ops.heartbeat(store, job_id, worker_id="w", attempt=1, lease_ms=1_000)
            except ReceiptError as exc:
                late_refusals.append(str(exc))
                continue
            late_refusals.append(out.status)

    async def pruner() -> int:
        removed = 0
        for _ in range(200):
            result = await retention.prune(store, MONTH, batch=13, max_batches=3)
            removed += result.jobs
            if removed >= 600:
                break
            await asyncio.sleep(0)
        return removed

    results = await asyncio.gather(worker(6), worker(6), worker(6), late_writer(), pruner())
    assert results[-1] == 600
    assert late_refusals and "ok" not in late_refusals
    assert len(live) == 54
    counts = rows_of(url, [j.job_id for j in live])
    for job in live:
        assert counts["jobs"][job.job_id] == 1
        assert counts["receipts"][job.job_id] == job.seq
    assert all(n == 0 for n in rows_of(url, preloaded[::50])["receipts"].values())
    with psycopg.connect(url) as conn:
        orphans = conn.execute(
            "SELECT count(*) FROM receipts r WHERE r.stream LIKE 'jobs/%%' AND NOT EXISTS "
            "(SELECT 1 FROM jobs j WHERE 'jobs/' || j.job_id = r.stream)"
        ).fetchone()
        leftovers = conn.execute(
            "SELECT count(*) FROM deliveries d WHERE NOT EXISTS "
            "(SELECT 1 FROM jobs j WHERE j.job_id = d.job_id)"
        ).fetchone()
    assert orphans == (0,) and leftovers == (0,)
    assert await assembly.verify(store) == []


async def test_the_retention_loop_runs_in_one_process_at_a_time(
    fresh: tuple[Store, str],
) -> None:
    store, url = fresh
    other = await assembly.open_store(url, min_size=1, max_size=5)  # another process's pool
    try:
        template = await run_template(store)
        await preload(store, template, 400, age_s=45 * 86_400.0)
        first = RetentionLoop(store, MONTH, batch=1, max_batches=10_000)
        second = RetentionLoop(other, MONTH, batch=1)
        skipped_before = metrics.value("receipt_retention_skipped_passes_total")

        def remaining() -> int:
            with psycopg.connect(url) as conn:
                row = conn.execute("SELECT count(*) FROM jobs").fetchone()
            return int(row[0]) if row else 0

        pass_a = asyncio.create_task(first.run_once())
        for _ in range(3_000):  # until its first batch: the template (not old) stays, 401 jobs
            if remaining() <= 400:
                break
            await asyncio.sleep(0.01)
        assert not pass_a.done()
        assert await second.run_once() is None  # single flight: the other pass is running
        result = await pass_a
        assert result is not None and result.jobs == 400
        assert metrics.value("receipt_retention_skipped_passes_total") - skipped_before == 1
        assert remaining() == 1

        # A lock held by any other backend also makes a pass skip, and nothing is deleted.
        await preload(store, template, 5, age_s=45 * 86_400.0)
        with psycopg.connect(url) as holder, holder.transaction():
            holder.execute(query("lock_key").encode(), {"key": retention.PASS_LOCK_KEY})
            assert await first.run_once() is None
            assert remaining() == 6
        done = await second.run_once()
        assert done is not None and done.jobs == 5

        # A pass that stops at its budget with more to prune says retention is falling behind.
        await preload(store, template, 3, age_s=45 * 86_400.0)
        behind_before = metrics.value("receipt_retention_behind_passes_total")
        short = RetentionLoop(store, MONTH, batch=1, max_batches=2)
        assert (await short.run_once()).jobs == 2  # type: ignore[union-attr]
        assert metrics.value("receipt_retention_behind_passes_total") - behind_before == 1
        assert (await short.run_once()).jobs == 1  # type: ignore[union-attr]
    finally:
        await other.close()


def test_retention_setting_and_durations_are_checked() -> None:
    assert durations.parse_duration("30d") == timedelta(days=30)
    assert durations.parse_duration("1w2d12h") == timedelta(days=9, hours=12)
    assert durations.parse_duration("0") is None
    for bad in ("30", "-1d", "30 days", "d", "1.5h", "36501d", "9" * 5000 + "d"):
        with pytest.raises(InvalidInput) as caught:
            durations.parse_duration(bad, name="RECEIPT_RETENTION")
        assert "RECEIPT_RETENTION" in caught.value.message and caught.value.field
    with pytest.raises(InvalidInput):
        RetentionLoop.from_settings(None, "thirty days", LoopSettings())  # type: ignore[arg-type]
    # The start check refuses it before any loop starts, naming the variable.
    with pytest.raises(SettingsError, match="RECEIPT_RETENTION"):
        load_settings({"RECEIPT_RETENTION": "thirty days"})
    assert load_settings({"RECEIPT_RETENTION": "30d"}).core.retention == "30d"
    assert RetentionLoop.from_settings(None, "0", LoopSettings()) is None  # type: ignore[arg-type]


def run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`receipt ARGS` in a process of its own, with `env` (read when it runs)."""
    return subprocess.run(
        [sys.executable, "-c", "from roles.cli.main import main; main()", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


async def test_receipt_prune_and_export_commands(fresh: tuple[Store, str], tmp_path: Any) -> None:
    store, url = fresh
    old = await finished(store, "completed")
    new = await finished(store, "failed")
    backdate(url, [old.job_id])
    env = {"RECEIPT_DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    receipt = functools.partial(run_cli, env)  # env as it reads when each runs

    bad = receipt("prune", "--older-than", "thirty")
    assert bad.returncode == 2 and "--older-than" in bad.stderr
    out = tmp_path / "old.jsonl"
    exported = receipt("export", "--older-than", "30d", "--output", str(out))
    assert exported.returncode == 0, exported.stderr
    assert "exported 1 jobs, 0 agent jobs, 0 objectives; prune" in exported.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["jobId"] for line in lines] == [old.job_id]
    assert lines[0]["job"]["status"] == "completed" and len(lines[0]["receipts"]) == old.seq
    dry = receipt("prune", "--older-than", "30d", "--dry-run")
    assert dry.returncode == 0 and "would remove jobs=1 " in dry.stdout
    done = receipt("prune", "--older-than", "30d", "--batch", "10")
    assert done.returncode == 0 and f"removed jobs=1 receipts={old.seq} " in done.stdout
    assert await store.get_job(old.job_id) is None
    assert await store.get_job(new.job_id) is not None

    # A database it cannot reach: one line and exit status 3 (1 is what --verify-only found),
    # and a failed export leaves the file it would have replaced as it was.
    env["RECEIPT_DATABASE_URL"] = "postgresql://postgres@127.0.0.1:9/none"
    out.write_text('{"archived": 1}\n')
    for args in (
        ("rebuild-projections", "--verify-only"),
        ("migrate",),
        ("prune", "--older-than", "30d"),
        ("export", "--older-than", "30d", "-o", str(out)),
    ):
        down = receipt(*args)
        assert down.returncode == 4, (args, down.stderr)  # unreachable: try again
        assert (
            down.stderr.startswith("receipt: the database failed: ")
            and "Traceback" not in down.stderr
        )
    assert out.read_text() == '{"archived": 1}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["old.jsonl"]  # no partial file left
    nowhere = receipt("export", "--older-than", "30d", "-o", str(tmp_path / "no" / "x.jsonl"))
    assert nowhere.returncode == 1 and "Traceback" not in nowhere.stderr
    assert "Could not open file" in nowhere.stderr or "No such file" in nowhere.stderr
    endless = receipt("prune", "--older-than", "99999999999d")
    assert endless.returncode == 2 and "at most 100 years" in endless.stderr


async def test_a_prune_before_an_exports_cutoff_removes_only_what_it_archived(
    fresh: tuple[Store, str], tmp_path: Any, make_database: Any
) -> None:
    """`export` then `prune` each took its own cutoff: what settled between the two was removed
    and in no archive. The export prints its cutoff and the prune that removes what it wrote;
    `--before` takes it. A command that writes nothing no longer migrates the database."""
    store, url = fresh
    old = await finished(store, "completed")
    between = await finished(store, "completed")
    backdate(url, [old.job_id])
    env = {"RECEIPT_DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    receipt = functools.partial(run_cli, env)  # env as it reads when each runs

    out = tmp_path / "archive.jsonl"
    exported = receipt("export", "--older-than", "30d", "-o", str(out))
    assert exported.returncode == 0, exported.stderr
    found = re.search(r"settled before (\S+): exported 1 jobs", exported.stderr)
    assert found is not None, exported.stderr
    cutoff_text = found[1]
    assert f"prune what it wrote with: receipt prune --before {cutoff_text}" in exported.stderr
    # `between` settles just after the export's cutoff: an age read again a moment later takes it.
    with psycopg.connect(url) as conn:
        conn.execute(
            "UPDATE jobs SET updated_at = %s::timestamptz + interval '1 second' WHERE job_id = %s",
            (cutoff_text, between.job_id),
        )
    await asyncio.sleep(1.5)
    again = receipt("prune", "--older-than", "30d", "--dry-run")
    assert again.returncode == 0 and "would remove jobs=2 " in again.stdout, again.stdout
    pruned = receipt("prune", "--before", cutoff_text)
    assert pruned.returncode == 0 and "removed jobs=1 " in pruned.stdout, pruned.stderr
    assert [json.loads(line)["jobId"] for line in out.read_text().splitlines()] == [old.job_id]
    assert await store.get_job(old.job_id) is None
    assert await store.get_job(between.job_id) is not None

    for args, message in (
        (("prune",), "give --older-than"),
        (("prune", "--older-than", "30d", "--before", cutoff_text), "give --older-than"),
        (("export", "--before", "2999-01-01T00:00:00+00:00"), "must be in the past"),
        (("prune", "--before", "2026-01-01T00:00:00"), "--before"),
    ):
        refused = receipt(*args)
        assert refused.returncode == 2 and message in refused.stderr, (args, refused.stderr)

    # An unmigrated database: the commands that write nothing say so and leave it as it was.
    env["RECEIPT_DATABASE_URL"] = make_database(migrated=False)
    for args in (
        ("export", "--older-than", "30d", "-o", str(tmp_path / "x.jsonl")),
        ("prune", "--older-than", "30d", "--dry-run"),
        ("rebuild-projections", "--verify-only"),
    ):
        behind = receipt(*args)
        assert behind.returncode == 2 and "run `receipt migrate` first" in behind.stderr, args
    with psycopg.connect(env["RECEIPT_DATABASE_URL"]) as conn:
        tables = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
        ).fetchone()
    assert tables == (0,)

    # A database whose newest migration is applied but an earlier one is not: the same refusal
    # as /readyz's (the newest version alone does not make a schema this code's).
    env["RECEIPT_DATABASE_URL"] = make_database()
    with psycopg.connect(env["RECEIPT_DATABASE_URL"], autocommit=True) as conn:
        conn.execute("DELETE FROM schema_migrations WHERE version = 2")
    behind = receipt("prune", "--older-than", "30d", "--dry-run")
    assert behind.returncode == 2, behind.stdout
    assert "migrations not applied: [2]" in behind.stderr, behind.stderr


async def test_an_agent_job_is_pruned_with_its_turns_never_half(fresh: tuple[Store, str]) -> None:
    await agent_job_scenario(*fresh)


async def agent_job_scenario(store: Store, url: str) -> None:
    from receipts.agent_jobs import lifecycle, model
    from tests.integration.test_agent_jobs import current, dispatcher, play_turn, request

    agent = "agent-retention"
    done, _ = await lifecycle.create(store, request(agent))
    stopped, _ = await lifecycle.create(store, request(agent))
    await dispatcher(store).run_once()
    running_agent = await current(store, done.agent_job_id)
    turn = running_agent.queue_job_id
    await play_turn(store, running_agent, {"outcome": "done", "result": 1})
    finished_agent = await lifecycle.settle_turn(store, done.agent_job_id, retry_base_ms=10)
    assert finished_agent is not None and finished_agent.status == "succeeded"
    live_turn = (await current(store, stopped.agent_job_id)).queue_job_id
    assert live_turn is not None
    # A running agent job whose turn settled (canceled while queued) but whose settlement the
    # dispatcher has not applied yet: the agent job is not settled.
    assert (await ops.cancel_queued(store, live_turn, reason="op")).ok
    assert turn is not None and (await store.get_job(turn)).status == "completed"  # type: ignore[union-attr]

    # The settled turn alone, past the cutoff, stays while its agent job is recent.
    backdate(url, [turn])
    assert (await retention.prune(store, MONTH)).jobs == 0
    with psycopg.connect(url) as conn:
        conn.execute(
            f"UPDATE agent_jobs SET updated_at = updated_at - interval '{OLD}' "
            "WHERE agent_job_id = ANY(%s)",
            ([done.agent_job_id, stopped.agent_job_id],),
        )
    # While its turn's queue job still owes its callback, the agent job stays, whole.
    with psycopg.connect(url) as conn:
        conn.execute(
            "INSERT INTO callback_outbox (job_id, event) VALUES (%s, 'completed') "
            "ON CONFLICT (job_id) DO NOTHING",
            (turn,),
        )
    owing = await retention.prune(store, MONTH)
    assert "agent_jobs" not in owing.removed and await store.get_job(turn) is not None
    await callback_posted(store, turn)
    exported = [line async for line in retention.export(store, MONTH)]
    dry = await retention.prune(store, MONTH, dry_run=True)
    result = await retention.prune(store, MONTH)
    assert dry.removed == result.removed
    # What goes is what was exported: the agent job with its chain, then its turn's queue job.
    assert [line.get("agentJobId") or line.get("jobId") for line in exported] == [
        done.agent_job_id,
        turn,
    ]
    assert len(exported[0]["receipts"]) == result.removed["agent_job_receipts"]
    assert result.removed["jobs"] == 1 and result.removed["agent_jobs"] == 1
    assert result.removed["agent_job_receipts"] > 0 and result.removed["agent_job_wakeups"] == 1
    assert await store.get_job(turn) is None
    assert await lifecycle.get(store, done.agent_job_id) is None
    assert await store.read_stream(model.stream_of(done.agent_job_id)) == []
    # The agent job not yet settled (its turn's settlement not yet applied) keeps its turn.
    assert (await current(store, stopped.agent_job_id)).status == "running"
    backdate(url, [live_turn])  # its turn, canceled while queued, is settled and old: it stays
    assert (await retention.prune(store, MONTH)).removed == {}
    assert await store.get_job(live_turn) is not None
    assert await store.read_stream(model.stream_of(stopped.agent_job_id)) != []
    assert (await retention.prune(store, MONTH)).removed == {}


async def test_an_objective_keeps_its_jobs_while_live_and_is_pruned_with_them_whole(
    fresh: tuple[Store, str],
) -> None:
    """An objective's control passes and its audit read its jobs: a settled task job past the
    cutoff stays while the objective is active, and while any job of it (its audit) is live;
    a settled objective past the cutoff with nothing of it live goes with all its jobs."""
    await objective_scenario(*fresh)
    # The same for an objective named as the API names one (scoped by organization, its jobs'
    # ids tagged at their end: migrations/0012).
    await objective_scenario(*fresh, scoped=True)


async def put_named(
    store: Store, job_id: str, objective_id: str, agent: str = "codex", **kwargs: Any
) -> Job:
    """`put` under runtime ids the API would make (`~` is no caller's): the job's and the
    objective's its payload names."""
    request = parse_enqueue(agent, body(**kwargs))
    payload = {**request.payload, "objectiveId": objective_id}
    return (await enqueue(store, dataclasses.replace(request, job_id=job_id, payload=payload))).job


async def objective_scenario(store: Store, url: str, scoped: bool = False) -> None:
    from receipts.objectives import store as objectives
    from receipts.objectives.model import audit_job_id, task_job_id
    from receipts.store import Draft

    name = "ret-objective-scoped" if scoped else "ret-objective"
    objective_id = await create_objective(store, scoped_id("org-a", name) if scoped else name)

    async def settled(job_id: str) -> str:
        job = await put_named(store, job_id, objective_id)
        worker = f"{job.job_id}:attempt:1/1"
        await ops.start_attempt(store, job.job_id, attempt=1, worker_id=worker, lease_ms=60_000)
        await ops.complete(store, job.job_id, worker_id=worker, attempt=1, result={})
        await callback_posted(store, job.job_id)
        return job.job_id

    task = await settled(task_job_id(objective_id, "t", 1))
    ordinary = (await finished(store, "completed")).job_id
    backdate(url, [task, ordinary])
    assert (await retention.prune(store, MONTH)).jobs == 1  # the ordinary job only
    assert await store.get_job(ordinary) is None and await store.get_job(task) is not None

    async with store.transaction() as tx:
        await objectives.update(
            tx, objective_id, lambda _: [Draft("objective.settled", {"status": "completed"})]
        )
    # Queued: the audit is owed.
    audit = await put_named(
        store, audit_job_id(objective_id), objective_id, "factory-control", kind=AUDIT_KIND
    )
    assert (await retention.prune(store, MONTH, dry_run=True)).jobs == 0
    assert (await retention.prune(store, MONTH)).jobs == 0
    assert await store.get_job(task) is not None

    # Past the cutoff while its audit is owed: the objective stays, whole.
    with psycopg.connect(url) as conn:
        conn.execute(
            f"UPDATE objectives SET updated_at = updated_at - interval '{OLD}' "
            "WHERE objective_id = %s",
            (objective_id,),
        )
    assert "objectives" not in (await retention.prune(store, MONTH)).removed
    assert await objectives.get(store, objective_id) is not None
    await ops.cancel_queued(store, audit.job_id, reason="test")  # nothing of it is live now
    await callback_posted(store, audit.job_id)
    # Another organization's job under the objective's id prefix, naming it, is not one of its
    # jobs: it neither keeps the objective nor goes with it.
    foreign_id = f"objective:{name}:x"
    foreign = await put_named(
        store, scoped_id("org-b", foreign_id) if scoped else foreign_id, objective_id, org="org-b"
    )
    assert foreign.job_id.startswith(f"objective:{name}:x")
    # A writer holding the objective's stream: the prune leaves the objective for a later one,
    # and with it its old task job (it goes with the objective, never before it).
    async with await psycopg.AsyncConnection.connect(url) as writer, writer.transaction():
        await writer.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            (f"stream:objectives/{objective_id}",),
        )
        held = await retention.prune(store, MONTH)
    assert "objectives" not in held.removed and held.jobs == 0
    assert await store.get_job(task) is not None
    assert await objectives.get(store, objective_id) is not None
    # A job of it still owes its callback: the objective stays, whole, until it is posted.
    with psycopg.connect(url) as conn:
        conn.execute(
            "INSERT INTO callback_outbox (job_id, event) VALUES (%s, 'canceled')",
            (audit.job_id,),
        )
    owing_dry = await retention.prune(store, MONTH, dry_run=True)
    owing = await retention.prune(store, MONTH)
    assert "objectives" not in owing.removed and owing.jobs == 0
    assert owing_dry.removed.get("objectives", 0) == 0 and owing_dry.jobs == 0  # as the prune
    assert await store.get_job(audit.job_id) is not None
    with psycopg.connect(url) as conn:
        conn.execute("DELETE FROM callback_outbox WHERE job_id = %s", (audit.job_id,))
    # Now the objective goes whole: its stream and row with its jobs, its audit job settled
    # just now and its task job long ago, each counted once, and exported first.
    exported = [line async for line in retention.export(store, MONTH)]
    dry = await retention.prune(store, MONTH, dry_run=True)
    result = await retention.prune(store, MONTH)
    assert dry.removed == result.removed
    assert [line.get("jobId") or line.get("objectiveId") for line in exported] == [
        objective_id,
        audit.job_id,
        task,
    ]
    assert len(exported[0]["receipts"]) == result.removed["objective_receipts"]
    assert exported[0]["objective"]["status"] == "completed"
    assert result.jobs == 2 and result.removed["objectives"] == 1
    assert result.removed["objective_receipts"] >= 2  # created, settled, control requests
    assert await store.get_job(audit.job_id) is None and await store.get_job(task) is None
    assert await objectives.get(store, objective_id) is None
    assert await store.read_stream(f"objectives/{objective_id}") == []
    assert await store.get_job(foreign.job_id) is not None  # queued, and not the objective's
    assert (await retention.prune(store, MONTH)).removed == {}


@pytest.fixture
async def linguistic(server_url: str) -> AsyncIterator[tuple[Store, str]]:
    """A migrated database whose default collation is ICU's en-US, as many production servers
    have (en_US.UTF-8): punctuation is ignored at its first level."""
    name = f"receipt_test_icu_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        try:
            conn.execute(
                f'CREATE DATABASE "{name}" TEMPLATE template0 LOCALE_PROVIDER icu '
                "ICU_LOCALE 'en-US' LOCALE 'C'".encode()
            )
        except psycopg.Error as exc:
            pytest.skip(
                "LINGUISTIC-COLLATION TEST NOT RUN: this server cannot create an ICU en-US "
                f"database ({exc})"
            )
    url = make_conninfo(server_url, dbname=name)
    try:
        await migrate_url(url)
        store = await assembly.open_store(url, min_size=2, max_size=20)
        try:
            yield store, url
        finally:
            await store.close()
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


async def test_agent_jobs_and_objectives_are_pruned_whole_under_a_linguistic_collation(
    linguistic: tuple[Store, str],
) -> None:
    """A job key range (`<agentJobId>:attempt:` … `:attempt;`, `objective:<id>:` … `;`) holds
    only in byte order; under en-US it would miss the very jobs it names (a live turn unseen, an
    objective's jobs never found), so retention compares `job_id COLLATE "C"`."""
    store, url = linguistic
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT 'a1:attempt:1' >= 'a1:attempt:' AND 'a1:attempt:1' < 'a1:attempt;'"
        ).fetchone()
    assert row == (False,)  # the database's own collation breaks the range
    await agent_job_scenario(store, url)
    await objective_scenario(store, url)


async def test_a_schedules_old_firings_are_compacted_and_its_fold_stays_the_projection(
    fresh: tuple[Store, str],
) -> None:
    """A per-minute schedule writes half a million firing receipts a year: retention deletes
    those past the cutoff but the newest ten (and its definitions), and one `schedule.compacted`
    keeps the totals, so the projection is still the fold of what is left."""
    from receipts.schedules import compaction, firing
    from receipts.schedules import store as schedules
    from tests.integration.test_schedules import T, made

    store, url = fresh
    sid = await made(store, "allow")
    stream = f"schedules/{sid}"

    async def backdate_stream() -> None:
        """As if written 40 days ago: the chain's times, then the projection folded from it."""
        with psycopg.connect(url) as conn:
            conn.execute(
                f"UPDATE receipts SET recorded_at = recorded_at - interval '{OLD}' "
                "WHERE stream = %s",
                (stream,),
            )
        await assembly.rebuild(store)

    for n in range(30):
        assert await firing.fire(store, sid, T + timedelta(seconds=5 * n)) == "enqueued"
    before = await schedules.get(store, sid)
    assert before is not None and before.fired == 30
    young = await retention.prune(store, MONTH)  # all of it recorded just now
    assert young.removed.get(retention.SCHEDULE_RECEIPTS) is None
    await backdate_stream()
    before = await schedules.get(store, sid)
    assert before is not None
    dry = await retention.prune(store, MONTH, dry_run=True)
    assert dry.removed[retention.SCHEDULE_RECEIPTS] == 20
    assert len(await store.read_stream(stream)) == 31  # a dry run writes nothing
    result = await retention.prune(store, MONTH)
    assert result.removed[retention.SCHEDULE_RECEIPTS] == 20
    kept = [r.type for r in await store.read_stream(stream)]
    assert kept == ["schedule.created"] + ["schedule.fired"] * 10 + [compaction.COMPACTED]
    after = await schedules.get(store, sid)
    assert after is not None
    assert (after.fired, after.last_job_id, after.recent) == (30, before.last_job_id, before.recent)
    assert await assembly.verify(store) == []  # the fold of what is left is the projection
    assert (await retention.prune(store, MONTH)).removed.get(retention.SCHEDULE_RECEIPTS) is None

    # Later firings, compacted again: the five oldest kept ones go, and the earlier compaction
    # with them (the new one holds the totals): one compaction receipt at most.
    for n in range(30, 35):
        assert await firing.fire(store, sid, T + timedelta(seconds=5 * n)) == "enqueued"
    await backdate_stream()
    again = await retention.prune(store, MONTH)
    assert again.removed[retention.SCHEDULE_RECEIPTS] == 6
    kept = [r.type for r in await store.read_stream(stream)]
    assert kept == ["schedule.created"] + ["schedule.fired"] * 10 + [compaction.COMPACTED]
    for n in range(35, 45):
        assert await firing.fire(store, sid, T + timedelta(seconds=5 * n)) == "enqueued"
    await backdate_stream()
    assert (await retention.prune(store, MONTH)).removed[retention.SCHEDULE_RECEIPTS] == 11
    kept = [r.type for r in await store.read_stream(stream)]
    assert kept == ["schedule.created"] + ["schedule.fired"] * 10 + [compaction.COMPACTED]
    # No firing since, all of it past every cutoff: a compaction alone is no work, so passes
    # neither delete nor append (no compaction receipts piling up).
    await backdate_stream()
    for _ in range(3):
        assert (await retention.prune(store, MONTH)).removed.get(
            retention.SCHEDULE_RECEIPTS
        ) is None
    assert [r.type for r in await store.read_stream(stream)] == kept
    final = await schedules.get(store, sid)
    assert final is not None and final.fired == 45
    assert await assembly.verify(store) == []
    # A firing still goes on the stream's head after the gaps.
    assert await firing.fire(store, sid, T + timedelta(seconds=5 * 45)) == "enqueued"
    assert (await schedules.get(store, sid)).fired == 46  # type: ignore[union-attr]


async def test_a_schedules_firings_of_the_last_two_days_are_kept_whatever_the_retention(
    fresh: tuple[Store, str],
) -> None:
    """A firing Temporal delivers late, or the other occurrence of a repeated hour, is looked
    up in the stream: a retention of an hour leaves the last two days' firings."""
    from receipts.schedules import firing
    from tests.integration.test_schedules import T, made

    store, url = fresh
    sid = await made(store, "allow")
    for n in range(15):
        assert await firing.fire(store, sid, T + timedelta(seconds=5 * n)) == "enqueued"
    with psycopg.connect(url) as conn:
        conn.execute(
            "UPDATE receipts SET recorded_at = recorded_at - interval '1 day' WHERE stream = %s",
            (f"schedules/{sid}",),
        )
    hour = await retention.prune(store, timedelta(hours=1))
    assert hour.removed.get(retention.SCHEDULE_RECEIPTS) is None
    assert len(await store.read_stream(f"schedules/{sid}")) == 16


async def test_a_pruned_agent_jobs_wakeups_leave_its_owners_session_but_the_head(
    fresh: tuple[Store, str],
) -> None:
    """An owner session's stream gets a wakeup per agent job that ends: they go with their
    agent jobs, but the stream's head stays, so no seq is ever used twice (a client that read
    up to it and resumes after it misses no later wakeup)."""
    from receipts.agent_jobs import lifecycle, model
    from tests.integration.test_agent_jobs import current, dispatcher, play_turn, request

    store, url = fresh
    session = f"session-{uuid.uuid4().hex[:8]}"
    ids = []
    for _ in range(2):
        created, _ = await lifecycle.create(store, request("agent-wake", owner_session_id=session))
        ids.append(created.agent_job_id)
    await dispatcher(store).run_once()
    for agent_job_id in ids:
        running_job = await current(store, agent_job_id)
        await play_turn(store, running_job, {"outcome": "done", "result": 1})
        settled = await lifecycle.settle_turn(store, agent_job_id, retry_base_ms=10)
        assert settled is not None and settled.status == "succeeded"
        await callback_posted(store, running_job.queue_job_id or "")
    stream = model.session_stream(session)
    assert [r.seq for r in await store.read_stream(stream)] == [1, 2]
    with psycopg.connect(url) as conn:
        conn.execute(
            f"UPDATE agent_jobs SET updated_at = updated_at - interval '{OLD}' "
            "WHERE agent_job_id = ANY(%s)",
            (ids,),
        )
    dry = await retention.prune(store, MONTH, dry_run=True)
    result = await retention.prune(store, MONTH)
    assert dry.removed["agent_session_receipts"] == result.removed["agent_session_receipts"] == 1
    assert result.removed["agent_jobs"] == 2
    assert [r.seq for r in await store.read_stream(stream)] == [2]  # the head stays
    # The session's next wakeup takes the next seq, not a used one.
    later, _ = await lifecycle.create(store, request("agent-wake", owner_session_id=session))
    await dispatcher(store).run_once()
    await play_turn(store, await current(store, later.agent_job_id), {"outcome": "done"})
    await lifecycle.settle_turn(store, later.agent_job_id, retry_base_ms=10)
    assert [r.seq for r in await store.read_stream(stream)] == [2, 3]


async def test_a_dry_run_counts_every_schedules_compaction_as_the_prune_deletes(
    fresh: tuple[Store, str],
) -> None:
    """More schedules than one batch takes (10 at the default batch): the dry run goes through
    every batch, as the prune does, and counts what it then deletes."""
    from receipts.schedules import firing
    from tests.integration.test_schedules import T, made

    store, url = fresh
    sids = [await made(store, "allow") for _ in range(12)]
    for sid in sids:
        for n in range(11):
            assert await firing.fire(store, sid, T + timedelta(seconds=5 * n)) == "enqueued"
    with psycopg.connect(url) as conn:
        conn.execute(
            f"UPDATE receipts SET recorded_at = recorded_at - interval '{OLD}' "
            "WHERE stream LIKE 'schedules/%%'"
        )
    await assembly.rebuild(store)
    dry = await retention.prune(store, MONTH, dry_run=True)
    result = await retention.prune(store, MONTH)
    assert dry.removed[retention.SCHEDULE_RECEIPTS] == 12  # one old firing each
    assert result.removed[retention.SCHEDULE_RECEIPTS] == 12
    assert await assembly.verify(store) == []


async def test_capped_compactions_of_a_quiet_schedule_leave_the_head_and_one_compaction(
    fresh: tuple[Store, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backlog larger than one compaction's cap, on a schedule that fires no more: each pass
    appends its compaction before dropping the earlier one, which was the stream's head."""
    from receipts.schedules import compaction, firing
    from tests.integration.test_schedules import T, made

    monkeypatch.setattr(compaction, "MAX_ROWS", 5)
    store, url = fresh
    sid = await made(store, "allow")
    stream = f"schedules/{sid}"
    for n in range(30):
        assert await firing.fire(store, sid, T + timedelta(seconds=5 * n)) == "enqueued"
    with psycopg.connect(url) as conn:
        conn.execute(
            f"UPDATE receipts SET recorded_at = recorded_at - interval '{OLD}' WHERE stream = %s",
            (stream,),
        )
    await assembly.rebuild(store)
    removed = [
        (await retention.prune(store, MONTH)).removed.get(retention.SCHEDULE_RECEIPTS)
        for _ in range(5)
    ]
    assert removed == [5, 6, 6, 6, None]  # 5 firings each, then the compaction before
    kept = [r.type for r in await store.read_stream(stream)]
    assert kept == ["schedule.created"] + ["schedule.fired"] * 10 + [compaction.COMPACTED]
    assert await assembly.verify(store) == []
    state = await schedules_get(store, sid)
    assert state.fired == 30


async def schedules_get(store: Store, sid: str) -> Any:
    from receipts.schedules import store as schedules

    state = await schedules.get(store, sid)
    assert state is not None
    return state


async def test_bounded_passes_take_turns_through_the_schedules(fresh: tuple[Store, str]) -> None:
    """Each pass compacts as many schedules as its batches allow and the next goes on after
    the last: a schedule late in id order is reached, not starved by earlier busy ones."""
    from receipts.schedules import firing
    from tests.integration.test_schedules import T, made

    store, url = fresh
    sids = sorted([await made(store, "allow") for _ in range(3)])
    for sid in sids:
        for n in range(11):
            assert await firing.fire(store, sid, T + timedelta(seconds=5 * n)) == "enqueued"
    with psycopg.connect(url) as conn:
        conn.execute(
            f"UPDATE receipts SET recorded_at = recorded_at - interval '{OLD}' "
            "WHERE stream LIKE 'schedules/%%'"
        )
    await assembly.rebuild(store)
    after, reached = "", []
    for _ in range(3):  # one schedule per batch (batch 100), one batch per pass
        result = await retention.prune(
            store, MONTH, batch=100, max_batches=1, schedules_after=after
        )
        after = result.schedules_after
        reached.append(after)
    assert reached == sids


async def test_a_pass_goes_on_past_what_it_keeps_back(fresh: tuple[Store, str]) -> None:
    """A batch starts after the last one's victims, so what a pass keeps back (an objective a
    job of which owes its callback, here the whole batch) is looked at once a pass, and the
    ones after it are still reached: with batches of one, the owing objective took every
    batch and the settled one after it was never pruned."""
    from receipts.objectives import store as objectives
    from receipts.objectives.model import task_job_id
    from receipts.store import Draft

    store, url = fresh
    owing_id = await create_objective(store, "ret-owes")
    quiet_id = await create_objective(store, "ret-quiet")
    owed = await put_named(store, task_job_id(owing_id, "t", 1), owing_id)
    await ops.cancel_queued(store, owed.job_id, reason="test")
    for objective_id in (owing_id, quiet_id):
        async with store.transaction() as tx:
            await objectives.update(
                tx, objective_id, lambda _: [Draft("objective.settled", {"status": "canceled"})]
            )
    with psycopg.connect(url) as conn:
        conn.execute(
            "INSERT INTO callback_outbox (job_id, event) VALUES (%s, 'canceled') "
            "ON CONFLICT DO NOTHING",
            (owed.job_id,),
        )
        for objective_id, age in ((owing_id, "41 days"), (quiet_id, OLD)):  # the owing first
            conn.execute(
                f"UPDATE objectives SET updated_at = now() - interval '{age}' "
                "WHERE objective_id = %s",
                (objective_id,),
            )
    pruned = await retention.prune(store, MONTH, batch=1)
    assert pruned.removed.get("objectives") == 1
    assert await objectives.get(store, quiet_id) is None
    assert await objectives.get(store, owing_id) is not None


async def test_a_retry_copy_of_a_turn_is_pruned_as_a_job(fresh: tuple[Store, str]) -> None:
    """A turn's retry copy (`retry-<uuid>`, made before turns were refused a retry) lies in no
    agent job's range of ids, so no agent job's prune takes it; as a job it was passed over for
    its kind: kept for ever. It goes as any job does now; an agent job's own turn still does
    not (it goes with its agent job)."""
    from receipts.kinds import TURN_KIND
    from receipts.retry import retry_request

    store, url = fresh
    request = dataclasses.replace(parse_enqueue("codex", body()), kind=TURN_KIND)
    turn = await enqueue(store, dataclasses.replace(request, job_id="aj-1:attempt:1"))
    assert turn.job.kind == TURN_KIND
    copy = await enqueue(store, retry_request(turn.job, "retry-0f6c"))
    for job_id in (turn.job.job_id, copy.job.job_id):
        await ops.cancel_queued(store, job_id, reason="test")
        await callback_posted(store, job_id)
    backdate(url, [turn.job.job_id, copy.job.job_id])
    pruned = await retention.prune(store, MONTH)
    assert pruned.jobs == 1
    assert await store.get_job(copy.job.job_id) is None
    assert await store.get_job(turn.job.job_id) is not None


async def test_a_batch_takes_one_objective_per_hundred_jobs_it_may_take(
    fresh: tuple[Store, str],
) -> None:
    """An objective goes whole with its chain (a long task's progress mirror writes tens of
    thousands of receipts): a batch of `--batch` jobs took `--batch` objectives, one
    transaction of hundreds of thousands of rows. It takes one per 100 jobs now."""
    from receipts.objectives import store as objectives
    from receipts.store import Draft

    store, url = fresh
    ids = [await create_objective(store, f"ret-batch-{n}") for n in range(3)]
    for objective_id in ids:
        async with store.transaction() as tx:
            await objectives.update(
                tx, objective_id, lambda _: [Draft("objective.settled", {"status": "failed"})]
            )
    with psycopg.connect(url) as conn:
        conn.execute(f"UPDATE objectives SET updated_at = updated_at - interval '{OLD}'")
    cutoff, _ = await retention.cutoff_for(store, MONTH)
    assert (await retention.prune_batch(store, cutoff, 100)).get("objectives") == 1
    assert (await retention.prune_batch(store, cutoff, 250)).get("objectives") == 2
    assert [await objectives.get(store, o) for o in ids] == [None, None, None]


async def test_an_agent_job_whose_wakeup_callback_is_still_owed_is_kept(
    fresh: tuple[Store, str],
) -> None:
    """A wakeup's event callback (RECEIPT_RESONATE_CALLBACK_URL / RECEIPT_EVENT_CALLBACK_URL) is
    tried again by later passes while it is neither posted nor given up, as a job's terminal
    callback is: retention keeps the agent job (and so its wakeup rows) until then, as it keeps a
    job whose callback_outbox row is there."""
    from receipts.agent_jobs import lifecycle, reads
    from tests.integration.test_agent_jobs import current, dispatcher, play_turn, request

    store, url = fresh
    created, _ = await lifecycle.create(store, request("agent-owed"))
    await dispatcher(store).run_once()
    running_job = await current(store, created.agent_job_id)
    await play_turn(store, running_job, {"outcome": "done", "result": 1})
    settled = await lifecycle.settle_turn(store, created.agent_job_id, retry_base_ms=10)
    assert settled is not None and settled.status == "succeeded"
    await callback_posted(store, running_job.queue_job_id or "")
    receiver = "http://127.0.0.1:9/down"
    # The receiver has been down for 15 minutes; RECEIPT_RETENTION=10m.
    with psycopg.connect(url) as conn:
        conn.execute(
            "UPDATE agent_jobs SET updated_at = updated_at - interval '15 minutes' "
            "WHERE agent_job_id = %s",
            (created.agent_job_id,),
        )
        conn.execute(
            "UPDATE jobs SET updated_at = updated_at - interval '15 minutes' WHERE job_id = %s",
            (running_job.queue_job_id,),
        )
    owed = await reads.unposted_wakeups(store, receiver, 50)
    assert owed, "the settled job's wakeup is owed to the receiver"
    await retention.prune(store, timedelta(minutes=10), callback_urls=[receiver])
    assert await lifecycle.get(store, created.agent_job_id) is not None
    assert await reads.unposted_wakeups(store, receiver, 50) == owed


async def test_a_batch_takes_no_more_objective_chain_than_its_size_allows(
    fresh: tuple[Store, str],
) -> None:
    """`--batch` bounds a batch's transaction: a settled objective goes whole, but a batch takes
    a second one only while their chains (the progress mirror writes up to a receipt a second
    per running task) stay within the batch's budget of receipts."""
    store, url = fresh
    ids = [f"long-{n}-{uuid.uuid4().hex[:6]}" for n in range(3)]
    with psycopg.connect(url) as conn:
        for objective_id in ids:
            conn.execute(
                "INSERT INTO objectives (objective_id, organization_id, seq, status, phase, title,"
                " created_at, updated_at, state) VALUES (%s, 'org-a', 20000, 'completed', 1, 't',"
                " now() - interval '41 days', now() - interval '40 days', '{}')",
                (objective_id,),
            )
            conn.execute(
                "INSERT INTO receipts (stream, seq, type, data) SELECT %s, s,"
                " 'objective.task_progress', '{}' FROM generate_series(1, 20000) s",
                (f"objectives/{objective_id}",),
            )
    first = await retention.prune(store, MONTH, batch=1000, max_batches=1)
    assert first.removed.get("objectives") == 1, first.removed
    assert first.removed["objective_receipts"] == 20_000
    rest = await retention.prune(store, MONTH, batch=1000)
    assert rest.removed["objectives"] == 2  # the others go in later batches, each whole
