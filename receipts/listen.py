"""One `LISTEN receipts` connection per process, fanned out to subscribers, reconnecting with backoff.

A subscriber must not lose a wake-up while the connection is down: after every (re)connect each
subscriber receives a `RECONNECTED` marker and rescans what it follows from the store.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import psycopg

from receipts.store import NOTIFY_CHANNEL

log = logging.getLogger("receipts.listen")

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 30.0


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

    def __init__(self, url: str, *, queue_size: int = 10_000) -> None:
        self.url = url
        self.queue_size = queue_size
        self._subscribers: set[asyncio.Queue[Notice]] = set()
        # Subscribers of one stream each (an event stream follows one job): a notice reaches
        # only them, so idle streams cost nothing per append (1 000 open streams
        # took an enqueue from 3.5 to 41 ms when every notice went to every one).
        self._by_stream: dict[str, set[asyncio.Queue[Notice]]] = {}
        self.connected = asyncio.Event()
        self.reconnects = 0

    @asynccontextmanager
    async def subscribe(self, stream: str | None = None) -> AsyncIterator[asyncio.Queue[Notice]]:
        """Yield a queue receiving notices (and `RECONNECTED` markers) until the block ends.

        With `stream`, only that stream's notices (and every `RECONNECTED`); without, all.
        """
        queue: asyncio.Queue[Notice] = asyncio.Queue(self.queue_size)
        group = self._subscribers if stream is None else self._by_stream.setdefault(stream, set())
        group.add(queue)
        try:
            yield queue
        finally:
            group.discard(queue)
            if stream is not None and not group:
                self._by_stream.pop(stream, None)

    @property
    def subscriber_count(self) -> int:
        """Queues subscribed now (all-stream and per-stream)."""
        return len(self._subscribers) + sum(len(g) for g in self._by_stream.values())

    def _publish(self, notice: Notice) -> None:
        if notice is RECONNECTED:
            targets = [*self._subscribers, *(q for g in self._by_stream.values() for q in g)]
        else:
            targets = [*self._subscribers, *self._by_stream.get(notice.stream, ())]
        for queue in targets:
            try:
                queue.put_nowait(notice)
            except asyncio.QueueFull:
                # A subscriber that fell this far behind rescans, exactly as after a reconnect.
                while not queue.empty():
                    queue.get_nowait()
                queue.put_nowait(RECONNECTED)

    async def run(self) -> None:
        """Listen until cancelled; reconnect with a 1 s → 30 s doubling backoff."""
        delay = 0.0
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {NOTIFY_CHANNEL}".encode())
                    delay = 0.0
                    self.connected.set()
                    log.info("listening", extra={"event": "listen.attached"})
                    self._publish(RECONNECTED)
                    async for note in conn.notifies():
                        notice = parse_notice(note.payload)
                        if notice is not None:
                            self._publish(notice)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure: drop the connection and reattach
                self.connected.clear()
                self.reconnects += 1
                delay = next_backoff(delay)
                log.warning(
                    "listen connection lost; reconnecting",
                    extra={"event": "listen.lost", "error": str(exc), "retryInS": delay},
                )
                await asyncio.sleep(delay)
