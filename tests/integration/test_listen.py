"""The process's LISTEN connection against real PostgreSQL: when the database drops it, the
listener reattaches after its backoff (the loss logged `listen.lost` and counted in
`receipt_listen_lost_total`: a listener that cannot attach slows every dispatch to the 60 s
rescan, and only the counter's alert says so), tells every subscriber to rescan
(`RECONNECTED`), and notices of later appends reach them again."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from receipts import metrics
from receipts.listen import BACKOFF_MAX_S, RECONNECTED, Listener, Notice, next_backoff
from receipts.store import Store
from tests.integration.helpers import put


async def next_notice(queue: asyncio.Queue[Notice], wanted: str, timeout: float) -> Notice:
    """The next notice of stream `wanted` (or the next RECONNECTED when `wanted` is "")."""
    async with asyncio.timeout(timeout):
        while True:
            notice = await queue.get()
            if notice.stream == wanted:
                return notice


async def drop_listen_connection(db_url: str) -> None:
    """Terminate the LISTEN connection of the listener named `listen-drop-test`."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as admin:
        cur = await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'listen-drop-test' AND query LIKE 'LISTEN %%'",
        )
        assert [row[0] for row in await cur.fetchall()] == [True]


async def test_a_dropped_listen_connection_reattaches_and_subscribers_rescan(
    store: Store, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "receipts.listen")
    # Named, so that only this listener's connection is dropped (a session may run others).
    listener = Listener(make_conninfo(db_url, application_name="listen-drop-test"))
    lost_before = metrics.value("receipt_listen_lost_total")
    running = asyncio.create_task(listener.run())
    try:
        async with listener.subscribe() as queue:
            assert await next_notice(queue, "", 10) is RECONNECTED
            job = (await put(store)).job
            assert (await next_notice(queue, f"jobs/{job.job_id}", 10)).seq == job.seq
            await drop_listen_connection(db_url)
            # Reattached after the first backoff (1 s): every subscriber rescans.
            assert await next_notice(queue, "", 10) is RECONNECTED
            assert listener.reconnects == 1
            events = [getattr(r, "event", None) for r in caplog.records]
            assert events.count("listen.lost") == 1 and "listen.attached" in events
            lost = next(r for r in caplog.records if getattr(r, "event", None) == "listen.lost")
            assert getattr(lost, "retryInS", None) == 1.0
            assert metrics.value("receipt_listen_lost_total") == lost_before + 1
            later = (await put(store)).job
            assert (await next_notice(queue, f"jobs/{later.job_id}", 10)).seq == later.seq
            # Attached again, the backoff starts over: the next drop waits 1 s, not 2.
            await drop_listen_connection(db_url)
            assert await next_notice(queue, "", 10) is RECONNECTED
            waits = [getattr(r, "retryInS", None) for r in caplog.records]
            assert [w for w in waits if w is not None] == [1.0, 1.0]
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


def test_the_backoff_doubles_from_one_second_to_thirty() -> None:
    delays, delay = [], 0.0
    for _ in range(7):
        delay = next_backoff(delay)
        delays.append(delay)
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, BACKOFF_MAX_S, BACKOFF_MAX_S]


async def test_channels_are_listened_to_on_demand_and_dropped_when_idle(
    store: Store, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No subscriber, no connection; a subscriber's channel attaches it; a notice reaches the
    subscribers of its concern only; a second channel reattaches (every subscriber rescans);
    a channel left without subscribers is dropped once idle."""
    from receipts import listen
    from receipts import operations as ops
    from receipts.notices import COMMANDS, DISPATCH

    monkeypatch.setattr(listen, "IDLE_CHANNEL_S", 0.4)
    listener = Listener(db_url)
    running = asyncio.create_task(listener.run())
    try:
        await asyncio.sleep(0.3)
        assert not listener.connected.is_set() and listener.listening == frozenset()
        async with listener.subscribe(channel=DISPATCH) as dispatch:
            assert await next_notice(dispatch, "", 10) is RECONNECTED
            assert listener.listening == {DISPATCH}
            job = (await put(store)).job
            stream = f"jobs/{job.job_id}"
            assert (await next_notice(dispatch, stream, 10)).types == ("job.enqueued",)
            async with listener.subscribe(stream, channel=COMMANDS) as commands:
                assert await next_notice(commands, "", 10) is RECONNECTED
                assert await next_notice(dispatch, "", 10) is RECONNECTED  # it rescans too
                assert listener.listening == {DISPATCH, COMMANDS}
                worker = f"{job.job_id}:attempt:1/1"
                started = await ops.start_attempt(
                    store, job.job_id, attempt=1, worker_id=worker, lease_ms=60_000
                )
                assert started.ok
                added = await ops.add_command(
                    store, job.job_id, type="steer", payload={"m": 1}, organization_id="org-a"
                )
                assert added.ok
                assert "queue.command" in (await next_notice(commands, stream, 10)).types
                # The lease and heartbeat were no dispatch concern; the command neither.
                assert dispatch.empty()
            # Idle for IDLE_CHANNEL_S: reattached with the dispatch channel alone.
            assert await next_notice(dispatch, "", 10) is RECONNECTED
            assert listener.listening == {DISPATCH}
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def test_a_subscriber_that_falls_behind_is_told_to_rescan() -> None:
    """A full queue loses no wake-up: its notices are dropped for one `RECONNECTED`, and the
    subscriber rescans what it follows, as after a reconnect."""
    listener = Listener("postgresql://unused", queue_size=2)
    async with listener.subscribe("jobs/j-1") as queue:
        for seq in (1, 2, 3):
            listener._publish(Notice("jobs/j-1", seq, ("job.progress",)))
        assert queue.get_nowait() is RECONNECTED and queue.empty()


async def test_a_reattach_waiting_out_its_backoff_tries_at_once_when_the_database_is_back(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a database outage the backoff had grown (1, 2, 4, 8 s…): new jobs' notices missed
    the dispatcher for up to that long past the database's return (11 s after a 20 s outage).
    The pool's first new connection nudges the listener, which tries at once."""
    from receipts import listen
    from receipts.assembly import open_store
    from roles.infra.ports import free_port

    monkeypatch.setattr(listen, "BACKOFF_START_S", 30.0)  # a backoff grown long
    listener = Listener(make_conninfo(db_url, port=free_port()), always=["receipts_dispatch"])
    running = asyncio.create_task(listener.run())
    try:
        await asyncio.sleep(0.5)  # refused: waiting out 30 s
        assert listener.reconnects == 1 and not listener.connected.is_set()
        listener.url = db_url  # the database is back
        store = await open_store(db_url, min_size=1, max_size=1, on_connect=listener.nudge)
        try:
            await asyncio.wait_for(listener.connected.wait(), 5)
        finally:
            await store.close()
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
