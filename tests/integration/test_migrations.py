"""The migrator across an upgrade: a pre-built index that failed, a database migrated by a
newer build than the one running (an image rolled back), and a migration whose connection the
database dropped while a role started."""

from __future__ import annotations

import asyncio
import logging

import psycopg
import pytest
from click.testing import CliRunner

import receipts.schema
import roles.infra.db
from receipts import metrics
from receipts.errors import TransientStorageError
from receipts.sql import migrations, query
from roles.cli.main import main
from roles.infra.db import migrate_url

BYTEWISE_VALID = (
    "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass('jobs_id_bytewise_idx')"
)


async def test_a_failed_concurrent_prebuild_of_the_bytewise_index_is_built_again(
    make_database: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README, "Upgrading to objective retention": a large installation builds
    `jobs_id_bytewise_idx` concurrently before migration 11. A concurrent build that is
    cancelled (a timeout, a Ctrl-C) leaves an INVALID index of that name, which
    `CREATE INDEX IF NOT EXISTS` took as built: the index was never used again, and retention's
    key ranges read the whole `jobs` table per agent job (1.6 s a batch at 200 000 jobs)."""
    url = str(make_database(migrated=False))  # type: ignore[operator]
    before_0011 = tuple(m for m in migrations() if m.version <= 10)
    monkeypatch.setattr(receipts.schema, "migrations", lambda: before_0011)
    await migrate_url(url)
    monkeypatch.undo()
    async with (
        await psycopg.AsyncConnection.connect(url, autocommit=True) as writer,
        await psycopg.AsyncConnection.connect(url, autocommit=True) as operator,
    ):
        # A write in flight: the concurrent build, its catalog entry made, waits for it and is
        # cancelled by its timeout.
        await writer.execute("BEGIN")
        await writer.execute("LOCK TABLE jobs IN ROW EXCLUSIVE MODE")
        await operator.execute("SET statement_timeout = '300ms'")
        with pytest.raises(psycopg.errors.QueryCanceled):
            await operator.execute(
                "CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_id_bytewise_idx "
                'ON jobs ((job_id COLLATE "C"))'
            )
        await writer.execute("COMMIT")
        assert await (await operator.execute(BYTEWISE_VALID)).fetchone() == (False,)

    await migrate_url(url)

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        assert await (await conn.execute(BYTEWISE_VALID)).fetchone() == (True,)


BOUNDED_READS = {
    "jobs_retryable_idx": "jobs (organization_id, status, updated_at, job_id) "
    "WHERE status IN ('failed', 'canceled')",
    "webhook_deliveries_pending_subject_idx": 'webhook_deliveries ((subject COLLATE "C")) '
    "WHERE status = 'pending'",
    "agent_job_wakeups_created_idx": "agent_job_wakeups (created_at)",
    "agent_jobs_open_idx": "agent_jobs (organization_id) "
    "WHERE status IN ('queued', 'running', 'waiting_on_user')",
}


# Migration 26's: the paged dispatch scans (README "Upgrading to paged dispatch scans").
PAGED_SCANS = {"jobs_queued_created_idx": "jobs (created_at, job_id) WHERE status = 'queued'"}


@pytest.mark.parametrize(("version", "indexes"), [(25, BOUNDED_READS), (26, PAGED_SCANS)])
async def test_failed_concurrent_prebuilds_of_a_migrations_indexes_are_built_again(
    make_database: object, monkeypatch: pytest.MonkeyPatch, version: int, indexes: dict[str, str]
) -> None:
    """README, "Upgrading to bounded reads" / "to paged dispatch scans": a large installation
    builds a migration's indexes concurrently first; one whose build was cancelled is left
    INVALID, which the migration's `IF NOT EXISTS` alone would take as built (never used: the
    reads it bounds scan again, every page of the dispatch scans sorts the whole queue)."""
    url = str(make_database(migrated=False))  # type: ignore[operator]
    before = tuple(m for m in migrations() if m.version < version)
    monkeypatch.setattr(receipts.schema, "migrations", lambda: before)
    await migrate_url(url)
    monkeypatch.undo()
    valid = "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)"
    tables = sorted({definition.split(" ", 1)[0] for definition in indexes.values()})
    async with (
        await psycopg.AsyncConnection.connect(url, autocommit=True) as writer,
        await psycopg.AsyncConnection.connect(url, autocommit=True) as operator,
    ):
        await writer.execute("BEGIN")
        for table in tables:
            await writer.execute(f"LOCK TABLE {table} IN ROW EXCLUSIVE MODE".encode())
        await operator.execute("SET statement_timeout = '300ms'")
        for name, definition in indexes.items():
            with pytest.raises(psycopg.errors.QueryCanceled):
                await operator.execute(
                    f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {definition}".encode()
                )
        await writer.execute("COMMIT")
        for name in indexes:
            assert await (await operator.execute(valid, (name,))).fetchone() == (False,), name

    await migrate_url(url)

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for name in indexes:
            assert await (await conn.execute(valid, (name,))).fetchone() == (True,), name


async def test_a_migration_behind_a_long_transaction_gives_up_instead_of_queueing_writes(
    make_database: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 25 builds indexes on jobs: behind a transaction that holds a write lock on it
    (an export, a rebuild, a stuck session) it waited as long as that one ran, and every write
    to jobs queued behind it. It gives up after MIGRATION_LOCK_TIMEOUT_MS, nothing applied, and
    `receipt migrate` names the migration; once the transaction ends it applies."""
    url = str(make_database(migrated=False))  # type: ignore[operator]
    shipped = migrations()
    monkeypatch.setattr(receipts.schema, "migrations", lambda: shipped[:24])
    await migrate_url(url)
    monkeypatch.undo()
    monkeypatch.setattr(receipts.schema, "MIGRATION_LOCK_TIMEOUT_MS", 300)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as holder:
        await holder.execute("BEGIN")
        await holder.execute("LOCK TABLE jobs IN ROW EXCLUSIVE MODE")
        with pytest.raises(TransientStorageError, match=r"migration 25 .* waited over 300 ms"):
            await asyncio.wait_for(migrate_url(url), 10)
        ran = await asyncio.to_thread(
            CliRunner().invoke, main, ["migrate"], env={"RECEIPT_DATABASE_URL": url}
        )
        assert ran.exit_code == 4, ran.output  # a lock waited out: try again
        assert "migration 25 (bounded_reads) waited over 300 ms" in ran.output, ran.output
        async with await psycopg.AsyncConnection.connect(url) as reader:
            cur = await reader.execute(query("migrated"))
            assert await cur.fetchone() == (24,)
        await holder.execute("COMMIT")
    assert await migrate_url(url) == [m.version for m in shipped[24:]]


def test_a_database_a_newer_build_migrated_is_named_not_called_up_to_date(
    make_database: object, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An image rolled back runs against the schema of the build after it. It keeps running
    (the migrations only add), but says so: `receipt migrate` printed `none (schema up to
    date)` and a role's start said nothing."""
    url = str(make_database())  # type: ignore[operator]
    shipped = migrations()
    older, newer = shipped[:-2], [m.version for m in shipped[-2:]]
    monkeypatch.setattr(receipts.schema, "migrations", lambda: older)
    monkeypatch.setattr(roles.infra.db, "migrations", lambda: older, raising=False)
    monkeypatch.setenv("RECEIPT_DATABASE_URL", url)

    with caplog.at_level(logging.WARNING):
        assert asyncio.run(migrate_url(url)) == []
    ahead = [r for r in caplog.records if getattr(r, "event", None) == "db.schema_ahead"]
    assert ahead and str(newer) in ahead[0].getMessage()
    assert metrics.value("receipt_schema_migrations_ahead") == len(newer)

    result = CliRunner().invoke(main, ["migrate"])
    assert result.exit_code == 0, result.output
    assert "up to date" not in result.output
    assert f"ahead of this build: migrations {newer}" in result.output


async def test_a_role_whose_migration_loses_its_connection_migrates_again(
    make_database: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A role's start waits out a database that refuses it (roles/infra/process.py `patiently`): a
    failover or a restart while the role migrates is that too. The migrator's lost connection
    reached the role as the store's `TransientStorageError`, which `patiently` let through:
    the role exited at once, unlike a role whose connect was refused a moment earlier."""
    from roles.infra import process

    monkeypatch.setattr(process, "DB_START_FIRST_WAIT_S", 0.05)
    url = str(make_database(migrated=False))  # type: ignore[operator]
    async with (
        await psycopg.AsyncConnection.connect(url, autocommit=True) as other,
        await psycopg.AsyncConnection.connect(url, autocommit=True) as operator,
    ):
        # Another role migrating: this role's migration waits for the lock.
        await other.execute("BEGIN")
        await other.execute(query("migrations_lock"))
        role = asyncio.create_task(process.patiently(lambda: migrate_url(url), "migrate", 10.0))
        waiting = (
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        for _ in range(200):
            if rows := await (await operator.execute(waiting)).fetchall():
                break
            await asyncio.sleep(0.02)
        # The database drops the migrator's connection (a restart, a failover).
        await operator.execute("SELECT pg_terminate_backend(%s)", (rows[0][0],))
        await other.execute("ROLLBACK")
        applied = await asyncio.wait_for(role, 10)
    assert applied == [m.version for m in migrations()]
