"""The dispatcher's rescans when the database fails them. The first rescan ran outside the loop
that outlives a failing pass: one failure (the database away a moment as the role started)
ended the dispatcher for the process's life, unlogged. A later rescan that failed left its
deadline in the past, and the loop rescanned again at once, failed again, logged and counted
`dispatch.pass_failed` — tens of thousands of times a second against an error that comes back
fast, a hot loop on the event loop and a flood in the logs."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime
from types import SimpleNamespace

import pytest

from receipts import deliveries, metrics
from receipts.errors import TransientStorageError
from receipts.listen import Listener
from receipts.settings import Settings
from roles.delivery import dispatcher as dispatching


class Scans:
    """`undelivered_queued`, failing the scans `failing` names (1 is the first)."""

    def __init__(self, failing: set[int] | None = None, *, fail_from: int | None = None) -> None:
        self.failing = failing or set()
        self.fail_from = fail_from
        self.calls = 0

    async def __call__(self, *_: object, **__: object) -> deliveries.Page:
        self.calls += 1
        if self.calls in self.failing or (self.fail_from and self.calls >= self.fail_from):
            raise TransientStorageError("the database is away")
        return deliveries.Page([], 0, deliveries.START)


async def _nothing_due(*_: object, **__: object) -> datetime | None:
    return None


async def _run_for(seconds: float) -> asyncio.Task[None]:
    starter = SimpleNamespace(settings=Settings())
    dispatcher = dispatching.Dispatcher(None, Listener("postgresql://unused"), starter)  # type: ignore[arg-type]
    task = asyncio.create_task(dispatcher.run())
    await asyncio.sleep(seconds)
    return task


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatching.deliveries, "next_available_at", _nothing_due)
    monkeypatch.setattr(dispatching, "MAX_IDLE_S", 0.05)
    monkeypatch.setattr(dispatching, "RESCAN_RETRY_S", 0.1, raising=False)


async def test_a_failed_first_rescan_does_not_end_the_dispatcher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scans = Scans({1})
    monkeypatch.setattr(dispatching.deliveries, "undelivered_queued", scans)
    before = metrics.value("receipt_loop_failed_passes_total", loop=dispatching.DISPATCHER_LOOP)
    task = await _run_for(0.5)
    try:
        assert not task.done()
        assert scans.calls >= 2  # the failed rescan was tried again
        failed = metrics.value("receipt_loop_failed_passes_total", loop=dispatching.DISPATCHER_LOOP)
        assert failed == before + 1
    finally:
        await _stop(task)


async def test_a_failed_rescan_is_tried_again_after_a_pause_not_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scans = Scans(fail_from=2)
    monkeypatch.setattr(dispatching.deliveries, "undelivered_queued", scans)
    task = await _run_for(0.5)
    await _stop(task)
    # The first scan, the idle rescan that failed at 0.05 s, then one every 0.1 s at most.
    assert 2 <= scans.calls <= 8
