"""The receipt store against real PostgreSQL: gapless seqs, positions, DB time, NOTIFY, errors."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from receipts import assembly, metrics
from receipts.errors import ConflictError, InvariantError, StorageError, TransientStorageError
from receipts.pool import CHECK_IDLE_S, RECONNECT_MAX_DELAY_S, UNREACHABLE_WAIT_S, has_input
from receipts.schema import latest_schema_version, migrate, schema_version
from receipts.store import Draft, Store, translate_errors
from tests.cut_proxy import CutProxy
from tests.eventually import eventually
from tests.integration.helpers import new_id, put


async def test_append_assigns_gapless_seq_global_position_and_database_time(store: Store) -> None:
    result = await put(store)
    job_id = result.job.job_id
    async with store.transaction() as tx:
        job = await tx.job_for_update(job_id)
        db_now = await tx.now()
        await tx.append_job(
            job_id,
            job,
            [
                Draft(
                    "queue.command",
                    {"commandId": "c1", "type": "steer", "lane": "steer", "payload": {"n": 1}},
                ),
                Draft(
                    "queue.command",
                    {
                        "commandId": "c2",
                        "type": "follow_up",
                        "lane": "follow_up",
                        "payload": {"n": 2},
                    },
                ),
            ],
        )
    receipts = await store.read_stream(f"jobs/{job_id}")
    assert [r.seq for r in receipts] == [1, 2, 3]
    assert receipts[0].position < receipts[1].position < receipts[2].position
    assert receipts[1].recorded_at == receipts[2].recorded_at == db_now
    assert [r.seq for r in await store.read_stream(f"jobs/{job_id}", after_seq=1)] == [2, 3]
    everything = await store.read_all(after_position=receipts[0].position - 1, limit=100_000)
    assert [r.seq for r in everything if r.stream == f"jobs/{job_id}"] == [1, 2, 3]


async def test_unique_stream_seq_is_the_last_guard(store: Store) -> None:
    result = await put(store)
    job = result.job
    with pytest.raises(ConflictError):
        async with store.transaction() as tx:
            # Append from a stale copy of the state: seq 1 already exists.
            stale = job.model_copy(update={"seq": 0})
            await tx.append_job(
                job.job_id,
                stale,
                [Draft("queue.command", {"commandId": "x", "type": "abort", "reason": "r"})],
            )
    assert [r.seq for r in await store.read_stream(f"jobs/{job.job_id}")] == [1]


async def test_reducer_refusal_writes_nothing(store: Store) -> None:
    job_id = new_id()
    with pytest.raises(InvariantError, match=f"^Invariant: no job for {job_id}$"):
        async with store.transaction() as tx:
            await tx.append_job(
                job_id, None, [Draft("job.heartbeat", {"workerId": "w", "attempt": 1})]
            )
    assert await store.read_stream(f"jobs/{job_id}") == []
    assert await store.get_job(job_id) is None


async def test_append_notifies_the_stream(store: Store, db_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener:
        await listener.execute("LISTEN receipts_dispatch")
        result = await put(store)
        note = await asyncio.wait_for(anext(listener.notifies()), timeout=5)
    assert f'"stream":"jobs/{result.job.job_id}"' in note.payload
    assert '"types":["job.enqueued"]' in note.payload


async def test_migrations_are_idempotent(db_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        assert await migrate(conn) == []
        assert await migrate(conn) == []
        assert await schema_version(conn) == latest_schema_version()


async def test_unreachable_database_is_a_transient_error() -> None:
    with pytest.raises(TransientStorageError):
        await assembly.open_store(
            "postgresql://postgres@127.0.0.1:1/none?connect_timeout=1",
            min_size=1,
            max_size=1,
            open_timeout=2,
        )


async def _kill_backends_of(store: Store, db_url: str, connections: int = 1) -> None:
    """End the store's `connections` pooled backends (checked out at once, so each is another)
    and wait until they are gone, as a restart ends them."""
    async with contextlib.AsyncExitStack() as held:
        conns = [await held.enter_async_context(store.connection()) for _ in range(connections)]
        pids = [conn.info.backend_pid for conn in conns]
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as admin:
        for pid in pids:
            await admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))


class _Checks:
    """Counts the pool's round-trip checks (the real check runs)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        check = AsyncConnectionPool.check_connection

        async def counted(conn: psycopg.AsyncConnection[Any]) -> None:
            self.count += 1
            await check(conn)

        monkeypatch.setattr(AsyncConnectionPool, "check_connection", staticmethod(counted))


async def test_the_api_pool_hands_out_a_new_or_returned_connection_without_a_round_trip(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from receipts.settings import Settings
    from roles.infra.db import open_store

    checks = _Checks(monkeypatch)
    store = await open_store(db_url, Settings.load({"RECEIPT_DB_POOL_MIN": "1"}), api=True)
    try:
        for _ in range(5):  # the first checkout takes the connection just made
            await store.now()
        assert checks.count == 0
        async with store.connection() as conn:
            assert not has_input(conn)
    finally:
        await store.close()


async def test_input_that_is_not_an_end_costs_a_round_trip_and_keeps_the_connection(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await assembly.open_store(db_url, min_size=1, max_size=1)
    try:
        async with store.connection() as listening:
            await listening.execute("LISTEN receipt_test_harmless")
            pid = listening.info.backend_pid
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as other:
            await other.execute("NOTIFY receipt_test_harmless")
        # Watched idle in the pool (a checkout would check it and read the notice).
        await eventually(_has_input(listening), timeout=5, what="the notice on the idle socket")
        checks = _Checks(monkeypatch)
        replaced = metrics.value("receipt_db_connections_replaced_total", reason="input")
        async with store.connection() as conn:
            assert conn.info.backend_pid == pid
            await conn.execute("UNLISTEN *")
        assert checks.count == 1
        assert metrics.value("receipt_db_connections_replaced_total", reason="input") == replaced
    finally:
        await store.close()


def _has_input(conn: psycopg.AsyncConnection[Any]) -> Callable[[], Awaitable[bool]]:
    async def read() -> bool:
        return has_input(conn)

    return read


async def test_after_a_restart_one_checkout_waits_about_a_second_not_a_backoff_per_connection(
    db_url: str,
) -> None:
    store = await assembly.open_store(db_url, min_size=6, max_size=6)
    try:
        await _kill_backends_of(store, db_url, connections=6)
        started = time.monotonic()
        # One dead connection found, the other five checked at once in the background: without
        # that, five backoffs (1, 2, 4, 8 s) pass the pool's 10 s timeout (a 503 in the api).
        assert await store.now() is not None
        assert time.monotonic() - started < 5
    finally:
        await store.close()


async def reached_again(store: Store, within_s: float = 30) -> float:
    """Seconds until the store answers again (its database just back)."""
    started = time.monotonic()
    while True:
        try:
            await store.now()
            return time.monotonic() - started
        except TransientStorageError:
            assert time.monotonic() - started < within_s, "the database was not reached again"


async def test_after_an_outage_the_pool_reconnects_within_seconds_not_a_doubled_backoff(
    db_url: str,
) -> None:
    """psycopg_pool doubled its reconnect delay without a ceiling (1, 3, 7, 15, 31 s after the
    loss): a database back after 9 s was reached only at 15 s, and every checkout meanwhile
    failed (the api's 503). The delay is capped at RECONNECT_MAX_DELAY_S."""
    info = conninfo_to_dict(db_url)
    proxy = CutProxy(str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432))
    await proxy.start()
    store = await assembly.open_store(
        make_conninfo(db_url, host="127.0.0.1", port=proxy.port), min_size=1, max_size=1
    )
    try:
        await proxy.cut()
        with pytest.raises(TransientStorageError):
            await store.now()  # the lost connection found; the pool's attempts begin
        await asyncio.sleep(9)
        await proxy.restore()
        assert await reached_again(store) < RECONNECT_MAX_DELAY_S + 1.5
    finally:
        await store.close()
        await proxy.cut()


async def test_a_pool_told_to_fail_fast_waits_a_second_while_the_database_cannot_be_reached(
    db_url: str,
) -> None:
    """The api's pool: with the database away, a checkout waited the pool's whole 10 s before
    the request's 503 (every request meanwhile held open). A failed attempt to connect fails the
    waiting checkouts, and later ones wait UNREACHABLE_WAIT_S until an attempt succeeds; the
    gauge says so, and the database back is reached at the next attempt. A pool that is only
    busy still waits its whole timeout."""
    info = conninfo_to_dict(db_url)
    proxy = CutProxy(str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432))
    await proxy.start()
    store = await assembly.open_store(
        make_conninfo(db_url, host="127.0.0.1", port=proxy.port),
        min_size=1,
        max_size=1,
        unreachable_wait_s=UNREACHABLE_WAIT_S,
    )
    try:
        async with store.connection():  # busy, the database answering: the whole wait
            started = time.monotonic()
            with pytest.raises(PoolTimeout):
                await store._pool.getconn(timeout=2.5)
            assert time.monotonic() - started >= 2.4
        assert metrics.value("receipt_dependency_reachable", dependency="database") == 1
        await proxy.cut()
        await asyncio.sleep(0.3)  # the idle connection's socket has its end
        started = time.monotonic()
        with pytest.raises(TransientStorageError) as failed:
            await store.now()  # the lost connection found; the pool's attempts fail it
        # The broken connection's check, psycopg_pool's 1 s before it looks again, a failed
        # attempt to connect: about a second, not the 10 s timeout the checkout began with.
        first = time.monotonic() - started
        # And says why (the api's api.storage_unavailable logs it), not that it waited 10 s.
        assert "cannot be reached" in str(failed.value), failed.value
        assert first < RECONNECT_MAX_DELAY_S + 1.5, first
        assert metrics.value("receipt_dependency_reachable", dependency="database") == 0
        waits = []
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(TransientStorageError):
                await store.now()
            waits.append(time.monotonic() - started)
        assert max(waits) < UNREACHABLE_WAIT_S + 0.5, waits
        await proxy.restore()
        assert await reached_again(store) < RECONNECT_MAX_DELAY_S + 1.5
        assert metrics.value("receipt_dependency_reachable", dependency="database") == 1
        assert store._pool.unreachable_since is None
    finally:
        await store.close()
        await proxy.cut()


async def test_a_connection_idle_across_a_restart_is_checked_and_replaced(db_url: str) -> None:
    store = await assembly.open_store(db_url, min_size=1, max_size=1)
    try:
        await store.now()
        await _kill_backends_of(store, db_url)
        await asyncio.sleep(CHECK_IDLE_S + 0.2)  # a restart takes longer than CHECK_IDLE_S
        before = metrics.value("receipt_db_connections_replaced_total", reason="idle")
        assert await store.now() is not None
        after = metrics.value("receipt_db_connections_replaced_total", reason="idle")
        assert after == before + 1
    finally:
        await store.close()


async def test_a_connection_whose_backend_ended_within_the_window_is_replaced_unseen(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await assembly.open_store(db_url, min_size=1, max_size=1)
    try:
        await store.now()
        await _kill_backends_of(store, db_url)  # a fast restart: back within CHECK_IDLE_S
        checks = _Checks(monkeypatch)
        before = metrics.value("receipt_db_connections_replaced_total", reason="input")
        # The ended backend's FATAL error is input on an idle connection: checked, replaced,
        # and the caller sees no error.
        assert await store.now() is not None
        assert metrics.value("receipt_db_connections_replaced_total", reason="input") == before + 1
        assert checks.count == 1
    finally:
        await store.close()


async def test_a_store_that_checks_every_checkout_never_hands_out_a_broken_connection(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await assembly.open_store(db_url, min_size=1, max_size=1, check_idle_s=0.0)
    try:
        await store.now()
        checks = _Checks(monkeypatch)
        await store.now()
        assert checks.count == 1
        await _kill_backends_of(store, db_url)
        assert await store.now() is not None  # checked, replaced, no error
    finally:
        await store.close()


async def test_a_pool_refused_one_more_connection_while_its_others_work_waits_on(
    db_url: str,
) -> None:
    """The database answering but refusing the pool one more connection (its role's or the
    server's connection limit, as the api's pool grows under load) is no outage. The failed
    attempt to grow failed every waiting checkout at once (in 0.01 s, the busy connection back
    in 2 s), the gauge read 0 and `store.unreachable` was logged, and every later checkout
    waited 1 s, not the pool's timeout, while the refused attempts went on."""
    role = f"limited_{uuid.uuid4().hex[:10]}"
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as admin:
        await admin.execute(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 1')
    store = await assembly.open_store(
        make_conninfo(db_url, user=role),
        min_size=1,
        max_size=2,
        unreachable_wait_s=UNREACHABLE_WAIT_S,
    )
    pool = store._pool

    async def refused() -> int:
        return int(pool.get_stats().get("connections_errors", 0))

    async def busy(checked_out: asyncio.Event) -> None:
        async with store.connection() as conn:
            checked_out.set()
            await conn.execute("SELECT pg_sleep(2)")

    try:
        for _ in range(2):
            checked_out = asyncio.Event()
            holding = asyncio.create_task(busy(checked_out))
            await checked_out.wait()
            before = await refused()
            started = time.monotonic()
            assert await store.now() is not None  # the busy connection, once it is back
            assert time.monotonic() - started >= 1.5
            assert await refused() > before  # it tried to grow, and was refused
            await holding
            assert metrics.value("receipt_dependency_reachable", dependency="database") == 1
            assert pool.unreachable_since is None
        # Its attempts to grow go on, refused, while its one connection works.
        before = await refused()
        await eventually(refused, lambda errors: errors > before, what="another refused attempt")
        assert metrics.value("receipt_dependency_reachable", dependency="database") == 1
        assert pool.unreachable_since is None
    finally:
        await store.close()
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as admin:
            await admin.execute(f'DROP ROLE "{role}"')


async def test_the_api_pool_is_larger_unless_the_size_is_set(db_url: str) -> None:
    from receipts.settings import Settings
    from roles.infra.db import API_POOL_MAX, open_store

    sizes = []
    for api, env in ((True, {}), (False, {}), (True, {"RECEIPT_DB_POOL_MAX": "5"})):
        store = await open_store(db_url, Settings.load(env), api=api)
        pool = store._pool
        sizes.append((pool.max_size, pool.check_idle_s, pool.unreachable_wait_s))
        await store.close()
    # Only the api's requests wait UNREACHABLE_WAIT_S; a worker's heartbeat and settle wait on.
    assert sizes == [
        (API_POOL_MAX, CHECK_IDLE_S, UNREACHABLE_WAIT_S),
        (10, CHECK_IDLE_S, None),
        (5, CHECK_IDLE_S, UNREACHABLE_WAIT_S),
    ]
    assert API_POOL_MAX == 20


async def test_one_transaction_appends_to_several_streams_gapless_or_not_at_all(
    store: Store,
) -> None:
    # `scratch/`: a stream kind no projection folds (these receipts are no real objective).
    objective, session = f"scratch/{new_id()}", f"sessions/{new_id()}"
    async with store.transaction() as tx:
        await tx.lock_streams([session, objective])
        first = await tx.append(objective, [Draft("objective.created", {"n": 1})])
        woken = await tx.append(session, [Draft("session.wakeup", {"n": 1})], expected_seq=0)
        more = await tx.append(objective, [Draft("a", {}), Draft("b", {})], expected_seq=1)
    assert [r.seq for r in first + more] == [1, 2, 3]
    assert [r.seq for r in woken] == [1]
    assert first[0].recorded_at == woken[0].recorded_at
    assert [r.type for r in await store.read_stream(objective)] == ["objective.created", "a", "b"]

    class Injected(Exception):
        pass

    with pytest.raises(Injected):
        async with store.transaction() as tx:
            await tx.append(objective, [Draft("c", {})])
            await tx.append(session, [Draft("session.wakeup", {"n": 2})])
            raise Injected
    assert len(await store.read_stream(objective)) == 3
    assert len(await store.read_stream(session)) == 1


async def test_stream_append_refuses_a_stale_expected_seq_and_job_streams(store: Store) -> None:
    stream = f"scratch/{new_id()}"
    async with store.transaction() as tx:
        await tx.append(stream, [Draft("a", {})])
    with pytest.raises(ConflictError, match="at seq 1, expected 0"):
        async with store.transaction() as tx:
            await tx.append(stream, [Draft("b", {})], expected_seq=0)
    with pytest.raises(ValueError, match="append_job"):
        async with store.transaction() as tx:
            await tx.append("jobs/x", [Draft("job.progress", {})])
    assert len(await store.read_stream(stream)) == 1


async def test_concurrent_appends_to_one_stream_stay_gapless(store: Store) -> None:
    stream = f"sessions/{new_id()}"

    async def one(n: int) -> None:
        async with store.transaction() as tx:
            await tx.append(stream, [Draft("session.wakeup", {"n": n})])

    await asyncio.gather(*(one(n) for n in range(20)))
    assert [r.seq for r in await store.read_stream(stream)] == list(range(1, 21))


async def test_a_program_limit_is_a_storage_error_not_a_transient_one(store: Store) -> None:
    """PostgreSQL's program limits (SQLSTATE class 54: an index row too large, a statement too
    complex) are psycopg OperationalErrors, which the store called transient: the api answered
    503 with Retry-After, and a client sent the same request again for ever."""
    async with store.connection() as conn:
        with pytest.raises(StorageError) as raised, translate_errors():
            await conn.execute(
                "CREATE TEMP TABLE wide (v text); CREATE INDEX ON wide (v);"
                "INSERT INTO wide SELECT string_agg(md5(g::text), '') FROM generate_series(1, 400) g"
            )
    assert not isinstance(raised.value, TransientStorageError), raised.value
    assert "index row" in str(raised.value), raised.value
