"""One LISTEN connection per process, fanned out to subscribers, reconnecting with backoff.

A subscriber names the channel of its concern (receipts/notices.py: dispatch, commands, agent
jobs, objectives, or every stream) and, optionally, the one stream it follows. The connection
LISTENs to the channels its subscribers name and to no other, and only while it has any: a
process with no open event stream hears no `receipts_streams` notice, one with no subscriber
holds no connection. A channel named for the first time reattaches the connection with it.

A subscriber must not lose a wake-up while the connection is down: after every (re)connect each
subscriber receives a `RECONNECTED` marker and rescans what it follows from the store.

Until it has heard one, an attach proves that notices reach it: another connection notifies a
channel of this listener's own, heard within `PROBE_WAIT_S` or the attach fails
(`listen.unheard`). Through a transaction-mode pooler a LISTEN holds no server session (the
pooler hands that server connection to another client after the statement, and drops what
it is sent meanwhile): the connection attached, and silently heard nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from asyncio import FIRST_COMPLETED
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import psycopg

from receipts import metrics
from receipts.notices import STREAMS
from receipts.sql import query

log = logging.getLogger("receipts.listen")

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 30.0
# A channel with no subscriber for this long is dropped at the next reattach (the API's event
# streams all closed; a worker's last attempt done): notices of it stop reaching the process.
IDLE_CHANNEL_S = 60.0
# How long an attach waits to hear its probe (a notice sent by another connection): one round
# trip on a database that answers.
PROBE_WAIT_S = 5.0


@dataclass(frozen=True, slots=True)
class Notice:
    """One append: the stream, its last seq after the append, and the receipt types appended."""

    stream: str
    seq: int
    types: tuple[str, ...]


RECONNECTED = Notice("", 0, ())
"""Sent to every subscriber after the LISTEN connection (re)attached: rescan, a notice may be lost."""


def parse_notice(payload: str) -> Notice | None:
    """Parse a NOTIFY payload written by the store; None when it is not one of ours."""
    try:
        body = json.loads(payload)
        return Notice(str(body["stream"]), int(body["seq"]), tuple(body.get("types") or ()))
    except (ValueError, KeyError, TypeError):
        return None


def next_backoff(current: float) -> float:
    """Return the next reconnect delay: from 1 s doubling to a 30 s ceiling."""
    return min(BACKOFF_MAX_S, max(BACKOFF_START_S, current * 2))


class Listener:
    """Holds the process's LISTEN connection and delivers notices to subscriber queues."""

    def __init__(self, url: str, *, queue_size: int = 10_000, always: Iterable[str] = ()) -> None:
        """`always`: channels listened to from the start, with or without subscribers."""
        self.url = url
        self.queue_size = queue_size
        self.always = frozenset(always)
        # Per channel: subscribers of every notice on it, and subscribers of one stream each (an
        # event stream follows one job): a notice reaches only them, so idle streams cost
        # nothing per append (1 000 open streams took an enqueue from 3.5 to 41 ms when every
        # notice went to every one).
        self._subscribers: dict[str, set[asyncio.Queue[Notice]]] = {}
        self._by_stream: dict[tuple[str, str], set[asyncio.Queue[Notice]]] = {}
        self._listening: frozenset[str] = frozenset()
        self._channels_changed = asyncio.Event()
        self._idle_since: dict[str, float] = {}  # channels whose last subscriber left, and when
        self.connected = asyncio.Event()
        self.reconnects = 0
        self._nudged = asyncio.Event()
        self.proven = False  # an attach heard its probe: notices reach this URL's sessions

    @asynccontextmanager
    async def subscribe(
        self, stream: str | None = None, channel: str = STREAMS
    ) -> AsyncIterator[asyncio.Queue[Notice]]:
        """Yield a queue receiving the notices of `channel` (and `RECONNECTED` markers) until
        the block ends. With `stream`, only that stream's notices (and every `RECONNECTED`)."""
        queue: asyncio.Queue[Notice] = asyncio.Queue(self.queue_size)
        if stream is None:
            group = self._subscribers.setdefault(channel, set())
        else:
            group = self._by_stream.setdefault((channel, stream), set())
        group.add(queue)
        self._idle_since.pop(channel, None)
        if channel not in self._listening:
            self._channels_changed.set()  # the connection reattaches with this channel
        try:
            yield queue
        finally:
            group.discard(queue)
            if not group:
                if stream is None:
                    self._subscribers.pop(channel, None)
                else:
                    self._by_stream.pop((channel, stream), None)
                if channel not in self.wanted():
                    self._idle_since[channel] = time.monotonic()

    @property
    def subscriber_count(self) -> int:
        """Queues subscribed now (all-stream and per-stream)."""
        return sum(len(g) for g in self._subscribers.values()) + sum(
            len(g) for g in self._by_stream.values()
        )

    @property
    def listening(self) -> frozenset[str]:
        """The channels the connection LISTENs to (or is attaching with) now."""
        return self._listening

    def wanted(self) -> frozenset[str]:
        """The channels some subscriber names now."""
        return self.always | frozenset(self._subscribers) | frozenset(c for c, _ in self._by_stream)

    def _publish(self, notice: Notice, channel: str | None = None) -> None:
        if notice is RECONNECTED:
            targets = [
                *(q for g in self._subscribers.values() for q in g),
                *(q for g in self._by_stream.values() for q in g),
            ]
        else:
            targets = [
                *self._subscribers.get(channel or STREAMS, ()),
                *self._by_stream.get((channel or STREAMS, notice.stream), ()),
            ]
        for queue in targets:
            try:
                queue.put_nowait(notice)
            except asyncio.QueueFull:
                # A subscriber that fell this far behind rescans, exactly as after a reconnect.
                while not queue.empty():
                    queue.get_nowait()
                queue.put_nowait(RECONNECTED)

    def nudge(self) -> None:
        """The database answers again (the process's pool just made a connection): a reattach
        waiting out its backoff tries now. After a 20 s outage the backoff (1, 2, 4, 8 s…) kept
        new jobs' notices from the dispatcher 11 s past the database's return."""
        self._nudged.set()

    async def run(self) -> None:
        """Listen until cancelled, to the channels subscribers name (none: no connection);
        reattach when a new channel is named, and after a failure with a 1 s → 30 s doubling
        backoff, cut short by a `nudge`."""
        delay = 0.0
        while True:
            self._channels_changed.clear()
            channels = self.wanted()
            if not channels:
                await self._channels_changed.wait()
                continue
            self._listening = channels  # a subscriber of another channel makes it reattach
            try:
                async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
                    probe = None if self.proven else f"receipt_probe_{secrets.token_hex(8)}"
                    listened = sorted(channels) + ([probe] if probe else [])
                    statement = "; ".join(f"LISTEN {c}" for c in listened)
                    await conn.execute(statement.encode())
                    if probe is not None:
                        await self._prove(conn, probe)
                    delay = 0.0
                    self.connected.set()
                    log.info(
                        "listening",
                        extra={"event": "listen.attached", "channels": sorted(channels)},
                    )
                    self._publish(RECONNECTED)
                    await self._relay(conn)
                    # A channel was named that the connection does not LISTEN to: reattach.
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure: drop the connection and reattach
                self.connected.clear()
                self.reconnects += 1
                metrics.LISTEN_LOST.inc()
                delay = next_backoff(delay)
                log.warning(
                    "listen connection lost; reconnecting",
                    extra={"event": "listen.lost", "error": str(exc), "retryInS": delay},
                )
                self._nudged.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._nudged.wait(), delay)
            finally:
                self._listening = frozenset()

    async def _prove(self, conn: psycopg.AsyncConnection[Any], probe: str) -> None:
        """Have another connection notify `probe` and wait `PROBE_WAIT_S` to hear it on
        `conn`; unheard, log `listen.unheard` (ERROR) and raise: the attach failed. Other
        notices heard meanwhile are dropped: the `RECONNECTED` that follows an attach has
        every subscriber rescan."""
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as other:
            await other.execute(query("listen_probe"), {"channel": probe})
        async for note in conn.notifies(timeout=PROBE_WAIT_S):
            if note.channel == probe:
                self.proven = True
                return
        log.error(
            f"the LISTEN connection did not hear a notice sent to it within {PROBE_WAIT_S:g} s: "
            "its URL reaches PostgreSQL through a transaction-mode pooler (PgBouncer "
            "pool_mode=transaction, a managed pooler's transaction port), where a LISTEN holds "
            "no session; set RECEIPT_DATABASE_DIRECT_URL to a URL without one (the database "
            "itself, or a session-mode pooler). Meanwhile new jobs wait for the dispatcher's "
            "60 s rescan and the queued redrive",
            extra={"event": "listen.unheard", "waitedS": PROBE_WAIT_S},
        )
        raise ConnectionError(f"the LISTEN connection heard no notice in {PROBE_WAIT_S:g} s")

    async def _relay(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Publish notices until a subscriber names a channel not listened to, or a channel has
        had no subscriber for `IDLE_CHANNEL_S` (then return, to reattach with the channels
        wanted now)."""

        async def relay() -> None:
            async for note in conn.notifies():
                notice = parse_notice(note.payload)
                if notice is not None:
                    self._publish(notice, note.channel)

        notes = asyncio.ensure_future(relay())
        try:
            while True:
                changed = asyncio.ensure_future(self._channels_changed.wait())
                done, _ = await asyncio.wait(
                    {notes, changed}, timeout=IDLE_CHANNEL_S / 2, return_when=FIRST_COMPLETED
                )
                changed.cancel()
                if notes in done:
                    notes.result()  # the connection failed (raises), or ended
                    raise ConnectionError("the LISTEN connection ended")
                if changed in done or self._idle_channels():
                    return
        finally:
            notes.cancel()
            await asyncio.gather(notes, return_exceptions=True)

    def _idle_channels(self) -> bool:
        """True when a channel listened to has had no subscriber for `IDLE_CHANNEL_S`."""
        now = time.monotonic()
        return any(
            now - self._idle_since.get(channel, now) >= IDLE_CHANNEL_S
            for channel in self._listening - self.wanted()
        )
