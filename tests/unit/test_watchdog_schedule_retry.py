"""worker-control's watchdog Schedule when Temporal refuses to write it at the role's start (a
frontend restarting, a namespace's schedule API refused a moment): it was logged once and never
tried again, and nothing counted it — with no Schedule the watchdog never ticks, and an
objective whose held tasks no job's end will dispatch waits for good (docs/factory.md). It is
tried again until written, each failure logged and counted as a loop's
(`receipt_loop_failed_passes_total{loop="watchdog_schedule"}`, ReceiptRecoveryLoopFailing)."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.service import RPCError, RPCStatusCode

from receipts import metrics
from receipts.objectives.watchdog import WatchdogSettings
from receipts.settings import Settings
from roles.delivery import watchdog_schedule
from roles.delivery.watchdog_schedule import keep_watchdog_schedule, schedule_id


class Refusing:
    """A Temporal client refusing the first `refusals` schedule creates."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.created: list[str] = []

    async def create_schedule(self, sid: str, _: Any) -> None:
        if self.refusals:
            self.refusals -= 1
            raise RPCError("frontend unavailable", RPCStatusCode.UNAVAILABLE, b"")
        self.created.append(sid)


async def test_a_watchdog_schedule_temporal_refused_is_tried_again_and_counted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(watchdog_schedule, "RETRY_S", 0.01)
    client = Refusing(2)
    settings = Settings()
    loop = "watchdog_schedule"
    before = metrics.value("receipt_loop_failed_passes_total", loop=loop)
    sid = await keep_watchdog_schedule(client, settings, WatchdogSettings.load({}))  # type: ignore[arg-type]
    assert sid == schedule_id(settings) and client.created == [sid]
    assert metrics.value("receipt_loop_failed_passes_total", loop=loop) == before + 2
    failed = [r for r in caplog.records if getattr(r, "event", None) == "watchdog.schedule_failed"]
    assert len(failed) == 2 and all(getattr(r, "loop", None) == loop for r in failed)
