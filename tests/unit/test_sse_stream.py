"""`stream_events` (roles/api/sse.py) over a store and a listener of the test's own: what the live
streams of tests/integration/test_api_sse.py and test_api_streams.py cannot time or provoke — a
rescan after the LISTEN connection reattached, a backlog longer than one read, a maximum lifetime
shorter than the keepalive period, and a console session that ends (or cannot be checked) while
the stream is idle."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from receipts.errors import TransientStorageError
from receipts.jobs import Receipt
from receipts.listen import RECONNECTED, Listener
from roles.api import sse
from roles.api.sse import Followed, stream_events

STREAM = "jobs/j-1"


class Receipts:
    """A stream's receipts in memory, read as `Store.read_stream` reads them."""

    def __init__(self, count: int = 0, data: dict[str, Any] | None = None) -> None:
        self.receipts: list[Receipt] = []
        self.data = data or {}
        self.reads: list[list[Receipt]] = []
        for _ in range(count):
            self.append()

    def append(self) -> None:
        seq = len(self.receipts) + 1
        self.receipts.append(Receipt(STREAM, seq, "job.progress", self.data, datetime.now(UTC)))

    async def read_stream(self, stream: str, after_seq: int = 0, limit: int = 10_000) -> Any:
        batch = [r for r in self.receipts if r.stream == stream and r.seq > after_seq][:limit]
        self.reads.append(batch)
        return batch


def folded(done_at: int | None = None) -> Followed[int]:
    """A followed thing that ends once receipt `done_at` is folded (None: never)."""
    return Followed(
        STREAM,
        fold=lambda _, receipt: receipt.seq,
        end=lambda seq: {"seq": seq} if seq == done_at else None,
    )


async def events(stream: AsyncIterator[str], until: int, timeout: float = 5) -> list[str]:
    """The ids (or `end`, `keepalive`) of the stream's next events, `until` of them at most, the
    stream read until it ends (or `until` events arrived)."""
    seen: list[str] = []
    async with asyncio.timeout(timeout):
        async for chunk in stream:
            if chunk.startswith("id: "):
                seen.append(chunk.split("\n")[0].removeprefix("id: "))
            elif chunk.startswith("event: end"):
                seen.append("end")
            elif chunk.startswith(": keepalive"):
                seen.append("keepalive")
            if len(seen) >= until:
                break
    return seen


async def test_a_reconnected_listener_makes_the_stream_read_what_it_missed() -> None:
    """After the LISTEN connection reattached (`RECONNECTED`) a notice may have been lost: the
    stream reads again from the last seq it sent."""
    store, listener = Receipts(2), Listener("postgresql://unused")
    stream = cast(
        AsyncGenerator[str, None],
        stream_events(store, listener, asyncio.Event(), folded(), 0, keepalive_s=30),  # type: ignore[arg-type]
    )
    assert await events(stream, 2) == ["1", "2"]
    store.append()  # its notice was lost with the connection
    listener._publish(RECONNECTED)
    assert await events(stream, 1) == ["3"]
    await stream.aclose()


async def test_a_backlog_longer_than_one_read_is_sent_whole_then_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sse, "SSE_PAGE", 3)
    monkeypatch.setattr(sse, "SSE_FIRST_READ", 3)
    store = Receipts(7)
    stream = stream_events(
        store,  # type: ignore[arg-type]
        Listener("postgresql://unused"),
        asyncio.Event(),
        folded(done_at=7),
        2,
        keepalive_s=30,
    )
    assert await events(stream, 10) == ["3", "4", "5", "6", "7", "end"]
    assert [len(read) for read in store.reads] == [3, 3, 1]


async def test_a_backlog_of_large_receipts_is_read_a_bounded_size_at_a_time() -> None:
    """A stream holds its last read until its client has taken it (one that stops reading, for
    good): a read is about `SSE_READ_BYTES` after the first `SSE_FIRST_READ` receipts, not
    `SSE_PAGE` receipts whatever their size (50 unread streams of 8 KB receipts: +452 MB)."""
    size = 20_000
    store = Receipts(200, {"output": "o" * size})
    stream = stream_events(
        store,  # type: ignore[arg-type]
        Listener("postgresql://unused"),
        asyncio.Event(),
        folded(done_at=200),
        0,
        keepalive_s=30,
    )
    seen = await events(stream, 201)
    assert seen == [*map(str, range(1, 201)), "end"]
    assert len(store.reads[0]) == sse.SSE_FIRST_READ
    assert max(len(read) for read in store.reads[1:]) * size <= sse.SSE_READ_BYTES


async def test_the_maximum_lifetime_ends_a_stream_before_its_next_keepalive() -> None:
    stream = stream_events(
        Receipts(1),  # type: ignore[arg-type]
        Listener("postgresql://unused"),
        asyncio.Event(),
        folded(),
        0,
        keepalive_s=30,
        max_lifetime_s=0.3,
    )
    started = time.monotonic()
    assert (await events(stream, 10))[0] == "1"  # then, at most, the keepalive it ended on
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("ended", ["signed out", "cannot tell"])
async def test_an_idle_console_stream_ends_once_its_session_does(ended: str) -> None:
    """`alive` is asked at each keepalive too: a session signed out (or a database that cannot
    say) while the stream is idle ends it, no keepalive sent for it."""
    answers = [True]

    async def alive() -> bool:
        if answers:
            return answers.pop()
        if ended == "cannot tell":
            raise TransientStorageError("the database is down")
        return False

    stream = stream_events(
        Receipts(1),  # type: ignore[arg-type]
        Listener("postgresql://unused"),
        asyncio.Event(),
        Followed(STREAM),
        0,
        keepalive_s=0.05,
        alive=alive,
    )
    assert await events(stream, 10) == ["1"]
