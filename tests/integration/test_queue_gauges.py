"""The gauges worker-control refreshes from the projection: the oldest queued job's age by lane and
worker group, read with the database clock, for deliverable jobs only, back to 0 once the queue
drains."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from receipts import metrics, reads
from receipts import operations as ops
from receipts.errors import StorageError
from receipts.jobs import LANES
from receipts.settings import Settings
from receipts.store import Store
from roles.infra.metrics import OTHER_GROUP, refresh_queue_depth, run_queue_depth
from tests.eventually import eventually
from tests.integration.helpers import put


def oldest(lane: str, group: str) -> float:
    return metrics.value("receipt_queue_oldest_age_seconds", lane=lane, group=group)


async def test_the_oldest_queued_age_by_lane_and_group(fresh: tuple[Store, str]) -> None:
    store, _ = fresh
    waiting = (await put(store, lane="collect", payload_extra={"task": {"command": ["true"]}})).job
    # A delayed job is queued but not late: it must not count as waiting.
    await put(store, "nobody-listens", lane="chat", delayMs=600_000)

    async def refreshed() -> float:
        await refresh_queue_depth(store)
        return oldest("collect", "codex")

    age = await eventually(refreshed, lambda s: s >= 1.0, timeout=20, what="a second of waiting")
    assert age < 20  # the job's own age, not an epoch or a history-wide minimum
    assert oldest("chat", "chat") == 0.0
    # Every lane and group has its series (0 where nothing waits), so an alert sees a drain.
    for lane in LANES:
        for group in ("chat", "codex", "control", OTHER_GROUP):
            assert (
                metrics.REGISTRY.get_sample_value(
                    "receipt_queue_oldest_age_seconds", {"lane": lane, "group": group}
                )
                is not None
            ), (lane, group)
    assert metrics.value("receipt_queue_depth", status="queued") == 2.0

    await ops.cancel_queued(store, waiting.job_id, reason="test")
    await refresh_queue_depth(store)
    assert oldest("collect", "codex") == 0.0


async def test_a_failed_refresh_is_logged_and_counted(
    fresh: tuple[Store, str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The gauges the queue alerts read keep their last values while the refresh fails: it was
    suppressed whole, with no log and no metric, so a stuck queue could page no one."""
    store, _ = fresh

    async def database_away(*_: Any) -> Any:
        raise StorageError("database away")

    monkeypatch.setattr(reads, "active_by_status", database_away)
    before = metrics.value("receipt_loop_failed_passes_total", loop="queue_depth")

    async def failures() -> float:
        return metrics.value("receipt_loop_failed_passes_total", loop="queue_depth")

    refreshing = asyncio.create_task(run_queue_depth(store, Settings(), interval_s=0.01))
    try:
        await eventually(
            failures,
            lambda n: n >= before + 2,
            timeout=10,
            what="two failed refreshes counted",
        )
    finally:
        refreshing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await refreshing
    failed = [r for r in caplog.records if getattr(r, "event", None) == "loop.failed"]
    assert failed and failed[0].loop == "queue_depth"  # type: ignore[attr-defined]
