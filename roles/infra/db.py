"""Open the store for a role: resolve the database URL (embedded by default), migrate, pool."""

from __future__ import annotations

import logging
from collections.abc import Callable

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from receipts import assembly, metrics
from receipts.pool import UNREACHABLE_WAIT_S
from receipts.schema import migrate, missing_migrations
from receipts.settings import Settings
from receipts.sql import migrations, query
from receipts.store import SESSION_SETTINGS, Store
from roles.infra.embedded import database_url

log = logging.getLogger("roles.infra.db")


def resolve_url(settings: Settings) -> str:
    """Return `RECEIPT_DATABASE_URL`, or start the embedded server and return its URI."""
    return database_url(settings.database_url, settings.data_dir)


def direct_url(settings: Settings) -> str:
    """The URL of a connection that keeps its server session: `RECEIPT_DATABASE_DIRECT_URL`
    when set (`RECEIPT_DATABASE_URL` is then a transaction-mode pooler), else the database's.
    The LISTEN connection, the migrations and the commands' long transactions use it."""
    return settings.database_direct_url or resolve_url(settings)


def named(url: str, role: str) -> str:
    """`url` naming its connections `receipt-<role>` (`application_name`, what
    `pg_stat_activity` shows), unless it names them itself: an operator sees which role holds
    which connection."""
    if "application_name" in conninfo_to_dict(url):
        return url
    return make_conninfo(url, application_name=f"receipt-{role}")


async def migrate_url(url: str) -> list[int]:
    """Apply pending migrations on `url`; return the versions applied."""
    applied, _ = await migrate_and_compare(url)
    return applied


async def migrate_and_compare(url: str) -> tuple[list[int], list[int]]:
    """Apply pending migrations on `url`; return the versions applied and those the database
    holds that this code does not ship: a newer build applied them (an image rolled back).
    This code runs against that schema, and says so (`db.schema_ahead`)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        applied = await migrate(conn)
        cur = await conn.execute(query("migrations_applied"), {})
        ahead = sorted(
            {int(row[0]) for row in await cur.fetchall()} - {m.version for m in migrations()}
        )
    metrics.SCHEMA_AHEAD.set(len(ahead))
    if ahead:
        log.warning(
            f"the database has migrations {ahead} that this build does not ship (a newer build "
            "applied them: an image rolled back); running against that schema",
            extra={"event": "db.schema_ahead", "versions": ahead},
        )
    return applied, ahead


async def schema_behind(url: str) -> str | None:
    """Why `url`'s schema is too old for this code (a migration it ships is not applied), or
    None: what a command that writes nothing checks instead of migrating. The same test as
    `/readyz`'s: every shipped migration applied, not merely the newest."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        missing = await missing_migrations(conn)
    if not missing:
        return None
    return (
        f"migrations not applied: {missing}; "
        "run `receipt migrate` first (this command writes nothing, migrations included)"
    )


# The api's pool when RECEIPT_DB_POOL_MAX is not set (the other roles: 10).
API_POOL_MAX = 20


async def open_store(
    url: str,
    settings: Settings,
    *,
    api: bool = False,
    on_connect: Callable[[], object] | None = None,
    pooled: bool = False,
) -> Store:
    """Open a pooled store on `url` with the configured pool size (`on_connect`: called at each
    new connection).

    Every role's pool checks its connections alike (receipts/pool.py `CHECK_IDLE_S`). The
    api's pool (`api=True`) is larger unless `RECEIPT_DB_POOL_MAX` is set (many requests at
    once), bounds each statement, and while the database cannot be reached a request waits
    `UNREACHABLE_WAIT_S` for a connection, not the pool's 10 s, before its 503. The other
    roles' writes (a heartbeat, a settle) wait the whole timeout on each of their tries.

    `pooled`: `url` is a transaction-mode pooler (`RECEIPT_DATABASE_DIRECT_URL` is set). Each
    transaction may run on another server connection, shared with the pooler's other clients:
    the pool prepares no statement (psycopg's `_pg3_N` would be missing there, or another's)
    and sets no session setting (the api's statement_timeout stayed on the server connection
    for every client after it: a worker's or a migration's statements were cancelled at 5 s).
    The settings the database does not give every session are logged
    (`db.session_settings_unset`): set them on the database role.
    """
    max_size = settings.pool_max_size
    if api and "pool_max_size" not in settings.model_fields_set:
        max_size = API_POOL_MAX
    session = dict(SESSION_SETTINGS)
    if api:
        # A request never holds a connection past this, however large the history it filters.
        session["statement_timeout"] = str(settings.api_statement_timeout_ms)
    store = await assembly.open_store(
        url,
        min_size=settings.pool_min_size,
        max_size=max_size,
        session={} if pooled else session,
        prepare=not pooled,
        unreachable_wait_s=UNREACHABLE_WAIT_S if api else None,
        owe_callbacks=bool(settings.callback_urls),
        on_connect=on_connect,
    )
    if pooled:
        try:
            await warn_unset(store, session)
        except BaseException:
            await store.close()
            raise
    return store


# Session settings one role wants and the others must not get (the api's bound on a request's
# statements): set on a database user of that role's own, never the shared one.
ROLE_OWN_SETTINGS = frozenset({"statement_timeout"})


async def warn_unset(store: Store, wanted: dict[str, str]) -> None:
    """Log each of `wanted`'s session settings that a session on `store` does not have from
    the database or its role (`db.session_settings_unset`), with the statement that sets it."""
    held = await store.held_settings(list(wanted))
    for name, want in wanted.items():
        if held.get(name) != want:
            fix = (
                # The api's alone: on a user the other roles and the migrations share, it
                # cancels their statements past it (what the pooler did with it).
                "give the api a database user of its own (not the one the other roles and the "
                f"migrations use) and ALTER ROLE <api user> SET {name} = '{want}'"
                if name in ROLE_OWN_SETTINGS
                else f"set it for the database user this role connects as: ALTER ROLE <user> "
                f"SET {name} = '{want}'"
            )
            log.warning(
                f"RECEIPT_DATABASE_URL is a transaction pooler (RECEIPT_DATABASE_DIRECT_URL is "
                f"set), so this pool sets no session setting (it would stay on the pooler's "
                f"server connection for its other clients): {name} is {held.get(name)!r} where "
                f"this role wants {want!r}; {fix}",
                extra={
                    "event": "db.session_settings_unset",
                    "setting": name,
                    "held": held.get(name),
                    "wanted": want,
                },
            )
