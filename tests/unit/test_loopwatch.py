"""The event loop's watch on a real loop and thread: a blocking call inside a coroutine is
logged with the frame that holds the loop, counted and timed; 0 watches nothing."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from receipts import metrics
from roles.infra.loopwatch import LoopWatch


def stall_count() -> float:
    return metrics.EVENT_LOOP_STALLS._value.get()


def held_count() -> float:
    return sum(
        sample.value
        for sample in metrics.EVENT_LOOP_STALL_SECONDS.collect()[0].samples
        if sample.name.endswith("_count")
    )


async def a_handler_that_blocks(seconds: float) -> None:
    time.sleep(seconds)  # noqa: ASYNC251 -- the mistake the watch is there to catch


async def test_a_blocked_loop_is_logged_with_the_frame_that_holds_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stalls, helds = stall_count(), held_count()
    watch = LoopWatch.start(200)
    assert watch is not None
    try:
        with caplog.at_level(logging.WARNING, logger="roles.infra.loopwatch"):
            await asyncio.sleep(0.25)  # the watch's first tick
            await a_handler_that_blocks(1.0)
            await asyncio.sleep(0.3)  # the loop answers again: the stall's end is logged
    finally:
        watch.stop()
    ours = [r for r in caplog.records if "a_handler_that_blocks" in getattr(r, "stack", "")]
    assert ours, [r.getMessage() for r in caplog.records]
    stalled = ours[0]
    assert stalled.event == "loop.stalled"  # type: ignore[attr-defined]
    assert stalled.where.endswith("in a_handler_that_blocks")  # type: ignore[attr-defined]
    assert "time.sleep(seconds)" in stalled.stack  # type: ignore[attr-defined]
    ended = [r for r in caplog.records if getattr(r, "event", None) == "loop.stall_ended"]
    assert ended and max(r.heldMs for r in ended) >= 800  # type: ignore[attr-defined]
    assert stall_count() > stalls
    assert held_count() > helds


async def test_zero_watches_nothing() -> None:
    assert LoopWatch.start(0) is None
