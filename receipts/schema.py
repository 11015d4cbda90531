"""The schema's migrations: applying those this code ships (`migrate`, what every role and
`receipt migrate` run first) and telling which a database lacks (`/readyz`, the commands that
write nothing)."""

from __future__ import annotations

import logging

import psycopg
import psycopg.errors
from psycopg.rows import TupleRow

from receipts.errors import TransientStorageError
from receipts.sql import migrations, query
from receipts.store import translate_errors

log = logging.getLogger("receipts.store")

# Each table lock a migration takes is waited for at most this long. A migration's index build
# queued behind a long transaction (an export, a rebuild) holds every write to that table queued
# behind itself until that transaction ends: with the timeout the run ends instead, nothing
# applied, and is tried again (a role's start waits it out; `receipt migrate` says so).
MIGRATION_LOCK_TIMEOUT_MS = 5_000


async def migrate(conn: psycopg.AsyncConnection[TupleRow]) -> list[int]:
    """Apply pending migrations in order, all in one transaction; return those applied.

    Concurrent migrators serialise on that transaction's advisory lock, and a migration that
    fails leaves none of this run's applied; every migration is idempotent, so running this
    twice changes nothing. A table lock not had within `MIGRATION_LOCK_TIMEOUT_MS` ends the
    run (`TransientStorageError`; a role's start tries again) instead of queueing writes.
    """
    applied: list[int] = []
    with translate_errors():
        async with conn.transaction():
            await conn.execute(query("migrations_lock"), {})
            await conn.execute(
                query("migrations_lock_timeout"), {"ms": str(MIGRATION_LOCK_TIMEOUT_MS)}
            )
            await conn.execute(query("migrations_table"), {})
            cur = await conn.execute(query("migrations_applied"), {})
            done = {row[0] for row in await cur.fetchall()}
            for migration in migrations():
                if migration.version in done:
                    continue
                try:
                    await conn.execute(migration.sql.encode())
                except psycopg.errors.LockNotAvailable as exc:
                    raise TransientStorageError(
                        f"migration {migration.version} ({migration.name}) waited over "
                        f"{MIGRATION_LOCK_TIMEOUT_MS} ms for a table lock another transaction "
                        "holds (pg_stat_activity names it); nothing was applied: run it again"
                    ) from exc
                await conn.execute(
                    query("migration_record"),
                    {"version": migration.version, "name": migration.name},
                )
                applied.append(migration.version)
                log.info(
                    "migration applied",
                    extra={"event": "db.migrated", "version": migration.version},
                )
    return applied


async def schema_version(conn: psycopg.AsyncConnection[TupleRow]) -> int:
    """Return the highest applied migration version (0 when none, or never migrated)."""
    with translate_errors():
        cur = await conn.execute(query("migrations_exist"), {})
        exists = await cur.fetchone()
        if not (exists and exists[0]):
            return 0
        cur = await conn.execute(query("migrated"), {})
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def missing_migrations(conn: psycopg.AsyncConnection[TupleRow]) -> list[int]:
    """The versions of the migrations this code ships that the database has not applied, in
    order (every one when it was never migrated): what `/readyz` and a command that writes
    nothing refuse on."""
    with translate_errors():
        cur = await conn.execute(query("migrations_exist"), {})
        exists = await cur.fetchone()
        applied: set[int] = set()
        if exists and exists[0]:
            cur = await conn.execute(query("migrations_applied"), {})
            applied = {int(row[0]) for row in await cur.fetchall()}
    return unapplied(applied)


def unapplied(applied: set[int]) -> list[int]:
    """The shipped migrations' versions not in `applied`, in order."""
    return sorted({m.version for m in migrations()} - applied)


def latest_schema_version() -> int:
    """Return the version of the newest migration this code ships."""
    return max(m.version for m in migrations())
