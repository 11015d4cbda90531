"""The process's LISTEN connection against real PostgreSQL: when the database drops it, the
listener reattaches after its backoff, tells every subscriber to rescan (`RECONNECTED`), and
notices of later appends reach them again."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from receipts.listen import BACKOFF_MAX_S, RECONNECTED, Listener, Notice, next_backoff
from receipts.store import NOTIFY_CHANNEL, Store
from tests.integration.helpers import put


async def next_notice(queue: asyncio.Queue[Notice], wanted: str, timeout: float) -> Notice:
    """The next notice of stream `wanted` (or the next RECONNECTED when `wanted` is "")."""
    async with asyncio.timeout(timeout):
        while True:
            notice = await queue.get()
            if notice.stream == wanted:
                return notice


async def test_a_dropped_listen_connection_reattaches_and_subscribers_rescan(
    store: Store, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "receipts.listen")
    # Named, so that only this listener's connection is dropped (a session may run others).
    listener = Listener(make_conninfo(db_url, application_name="listen-drop-test"))
    running = asyncio.create_task(listener.run())
    try:
        async with listener.subscribe() as queue:
            assert await next_notice(queue, "", 10) is RECONNECTED
            job = (await put(store)).job
            assert (await next_notice(queue, f"jobs/{job.job_id}", 10)).seq == job.seq
            async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as admin:
                cur = await admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = 'listen-drop-test' AND query = %s",
                    (f"LISTEN {NOTIFY_CHANNEL}",),
                )
                assert [row[0] for row in await cur.fetchall()] == [True]
            # Reattached after the first backoff (1 s): every subscriber rescans.
            assert await next_notice(queue, "", 10) is RECONNECTED
            assert listener.reconnects == 1
            events = [getattr(r, "event", None) for r in caplog.records]
            assert events.count("listen.lost") == 1 and "listen.attached" in events
            lost = next(r for r in caplog.records if getattr(r, "event", None) == "listen.lost")
            assert getattr(lost, "retryInS", None) == 1.0
            later = (await put(store)).job
            assert (await next_notice(queue, f"jobs/{later.job_id}", 10)).seq == later.seq
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
