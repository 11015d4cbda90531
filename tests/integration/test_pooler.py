"""A deployment behind a real PgBouncer in transaction mode (tests/pgbouncer.py; the tests skip
when it is not installed). Through it each transaction may run on another server connection,
shared with the pooler's other clients, and a LISTEN holds no session: psycopg's prepared
statements failed (`prepared statement "_pg3_0" already exists`), the api's session
statement_timeout stayed on a server connection and cancelled other clients' statements, and
the LISTEN connection attached and silently heard nothing. With RECEIPT_DATABASE_DIRECT_URL the
LISTEN connection and the migrations go around the pooler, and the pool prepares nothing and
sets no session state; without it, the listener says it hears nothing (`listen.unheard`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from receipts import metrics
from receipts.assembly import open_store
from receipts.errors import UnansweredStorageError
from receipts.listen import RECONNECTED, Listener
from roles.infra.process import Runtime, open_runtime
from roles.infra.settings import load
from tests import pgbouncer
from tests.integration.helpers import put
from tests.integration.test_listen import next_notice

pytestmark = pytest.mark.skipif(not pgbouncer.installed(), reason=pgbouncer.SKIP_REASON)


@pytest.fixture(scope="module")
def pooler_port(server_url: str) -> Iterator[int]:
    with pgbouncer.pgbouncer(server_url, mode="transaction", pool_size=2) as port:
        yield port


async def test_a_listen_through_a_transaction_pooler_says_it_hears_nothing(
    db_url: str, pooler_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the connection attached (`listen.attached`, `connected` set) and heard no
    notice, and nothing said so: new jobs waited for the 60 s rescan."""
    caplog.set_level(logging.INFO, "receipts.listen")
    lost_before = metrics.value("receipt_listen_lost_total")
    listener = Listener(make_conninfo(db_url, port=pooler_port), always=["receipts_dispatch"])
    running = asyncio.create_task(listener.run())
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(listener.connected.wait(), 7)
        assert not listener.connected.is_set()
        events = [getattr(r, "event", None) for r in caplog.records]
        assert "listen.unheard" in events and "listen.attached" not in events
        unheard = next(r for r in caplog.records if getattr(r, "event", None) == "listen.unheard")
        assert unheard.levelno == logging.ERROR
        assert "RECEIPT_DATABASE_DIRECT_URL" in unheard.getMessage()
        assert metrics.value("receipt_listen_lost_total") == lost_before + 1
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


@pytest.fixture
async def pooled_api(make_database: object, pooler_port: int) -> AsyncIterator[tuple[Runtime, str]]:
    """The api role's runtime with RECEIPT_DATABASE_URL through the pooler and
    RECEIPT_DATABASE_DIRECT_URL around it (its statement_timeout 300 ms), and the pooled URL."""
    direct = str(make_database())  # type: ignore[operator]
    pooled = make_conninfo(direct, port=pooler_port)
    settings = load(
        {
            "RECEIPT_DATABASE_URL": pooled,
            "RECEIPT_DATABASE_DIRECT_URL": direct,
            "RECEIPT_API_STATEMENT_TIMEOUT_MS": "300",
        }
    )
    runtime = await open_runtime("api", settings, lazy_client=True)
    try:
        yield runtime, pooled
    finally:
        await runtime.close()


async def test_behind_a_transaction_pooler_no_statement_is_prepared(
    pooled_api: tuple[Runtime, str],
) -> None:
    """The same statements, many times, from several connections at once. Before: psycopg
    prepared each after five runs, on one server connection, and ran it on another:
    `prepared statement "_pg3_0" already exists` / `does not exist` (a StorageError)."""
    store = pooled_api[0].store
    jobs = [(await put(store)).job for _ in range(4)]

    async def reads() -> None:
        for _ in range(15):
            assert all([await store.get_job(job.job_id) for job in jobs])
            await store.now()

    await asyncio.gather(*(reads() for _ in range(8)))


async def test_behind_a_transaction_pooler_the_listener_goes_around_it(
    pooled_api: tuple[Runtime, str],
) -> None:
    """Before: the LISTEN connection went through the pooler and heard no append's notice."""
    runtime = pooled_api[0]
    async with runtime.listener.subscribe() as queue:
        assert await next_notice(queue, "", 10) is RECONNECTED
        job = (await put(runtime.store)).job
        assert (await next_notice(queue, f"jobs/{job.job_id}", 10)).seq == job.seq


async def test_behind_a_transaction_pooler_the_apis_statement_timeout_stays_its_own(
    pooled_api: tuple[Runtime, str], caplog: pytest.LogCaptureFixture
) -> None:
    """The api's pool set statement_timeout (5 s by default) on each new connection, for the
    session: through the pooler it stayed on that server connection for the pooler's next
    clients. Before: another client's (a worker's, a migration's) statement longer than it was
    cancelled (`canceling statement due to statement timeout`)."""
    caplog.set_level(logging.WARNING, "roles.infra.db")
    runtime, pooled = pooled_api
    await runtime.store.ping()
    async with await psycopg.AsyncConnection.connect(pooled, autocommit=True) as other:
        for _ in range(3):
            cur = await other.execute("SELECT current_setting('statement_timeout'), pg_sleep(0.4)")
            row = await cur.fetchone()
            assert row is not None and row[0] == "0"


async def test_a_setting_the_pool_behind_a_pooler_lacks_is_logged_with_its_fix(
    make_database: object, pooler_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    """What the pool no longer sets, it says (`db.session_settings_unset`, with the statement
    that sets it); nothing once the database gives every session what the role wants."""
    caplog.set_level(logging.WARNING, "roles.infra.db")

    async def unset_after_start(direct: str) -> dict[object, logging.LogRecord]:
        caplog.clear()
        settings = load(
            {
                "RECEIPT_DATABASE_URL": make_conninfo(direct, port=pooler_port),
                "RECEIPT_DATABASE_DIRECT_URL": direct,
                "RECEIPT_API_STATEMENT_TIMEOUT_MS": "300",
            }
        )
        runtime = await open_runtime("api", settings, lazy_client=True)
        await runtime.close()
        return {
            getattr(r, "setting", None): r
            for r in caplog.records
            if getattr(r, "event", None) == "db.session_settings_unset"
        }

    unset = await unset_after_start(str(make_database()))  # type: ignore[operator]
    timeout = unset["statement_timeout"]
    assert timeout.levelno == logging.WARNING and getattr(timeout, "wanted", None) == "300"
    # The api's own bound: on the user the other roles and the migrations share (one
    # RECEIPT_DATABASE_URL, as deploy/k8s gives), it would cancel their statements past 300 ms.
    assert "a database user of its own" in timeout.getMessage(), timeout.getMessage()
    assert "ALTER ROLE <api user> SET statement_timeout = '300'" in timeout.getMessage()
    assert "ALTER ROLE <user> SET jit = 'off'" in unset["jit"].getMessage()

    set_on_the_database = str(make_database())  # type: ignore[operator]
    with psycopg.connect(set_on_the_database, autocommit=True) as admin:
        name = admin.info.dbname
        admin.execute(f'ALTER DATABASE "{name}" SET statement_timeout = 300'.encode())
        admin.execute(f'ALTER DATABASE "{name}" SET jit = off'.encode())
    assert await unset_after_start(set_on_the_database) == {}


@pytest.mark.parametrize("mode", ["transaction", "session"])
async def test_a_commit_whose_backend_ended_behind_pgbouncer_is_unanswered(
    db_url: str, server_url: str, mode: str
) -> None:
    """A failover behind PgBouncer (any mode): the backend of a transaction ends before its
    COMMIT. PgBouncer queues the backend's FATAL error and its own (`server conn crashed?`), and
    psycopg's COMMIT read two results: `InternalError`, before a StorageError (500 at the api,
    never retried by an activity) where the commit's answer was lost: `UnansweredStorageError`
    (transient, the write perhaps made). The pool goes on with a new server connection."""
    with pgbouncer.pgbouncer(server_url, mode=mode) as port:
        store = await open_store(make_conninfo(db_url, port=port), min_size=1, max_size=2)
        try:
            with pytest.raises(UnansweredStorageError):
                async with store.transaction() as tx:
                    await tx.fetch("ping", {})
                    async with await psycopg.AsyncConnection.connect(
                        db_url, autocommit=True
                    ) as admin:
                        cur = await admin.execute(
                            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                            " WHERE datname = current_database() AND state = 'idle in transaction'"
                        )
                        assert [row[0] for row in await cur.fetchall()] == [True]
                    await asyncio.sleep(0.3)  # the backend's FATAL reaches the pooler
            assert await store.fetch("ping", {}) == [(1,)]
        finally:
            await store.close()
