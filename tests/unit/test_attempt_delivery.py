"""How the driver delivers an attempt (pure): Temporal's heartbeat timeout, the summary, the
activity id, and the setting behind the timeout."""

from __future__ import annotations

from datetime import timedelta

import pytest

from receipts.messages import DriverAction, DriverPlan
from receipts.settings import Settings, SettingsError
from workflows.driver import attempt_activity_id, attempt_summary, worker_lost_timeout


def plan(heartbeat_ms: int, worker_lost_timeout_ms: int) -> DriverPlan:
    return DriverPlan(
        DriverAction.DISPATCH,
        attempt=3,
        agent_id="codex",
        kind="factory.task.run",
        heartbeat_ms=heartbeat_ms,
        worker_lost_timeout_ms=worker_lost_timeout_ms,
    )


def test_the_heartbeat_timeout_is_the_worker_lost_timeout_at_the_spec_leases() -> None:
    # Codex at the spec's default lease: a receipt cadence of 200 s (two: 400 s, the old
    # timeout); Temporal now gives up on a silent worker after 30 s.
    assert worker_lost_timeout(plan(200_000, 30_000)) == timedelta(seconds=30)


def test_a_short_lease_keeps_redelivery_before_the_lease_can_expire() -> None:
    # Lease 10 s: cadence 3.3 s; two cadences (6.7 s) come before the 30 s and the lease's end.
    assert worker_lost_timeout(plan(3_333, 30_000)) == timedelta(milliseconds=6_666)


def test_a_plan_recorded_before_the_setting_existed_keeps_two_cadences() -> None:
    assert worker_lost_timeout(plan(200_000, 0)) == timedelta(seconds=400)


def test_summary_and_activity_id() -> None:
    assert attempt_summary(plan(1_000, 30_000)) == "codex factory.task.run attempt 3"
    assert attempt_activity_id(3) == "attempt:3"


def test_the_worker_lost_timeout_setting() -> None:
    assert Settings.load({}).worker_lost_timeout_ms == 30_000
    assert Settings.load({"RECEIPT_WORKER_LOST_TIMEOUT_MS": "5000"}).worker_lost_timeout_ms == 5_000
    for bad in ("500", "soon"):
        with pytest.raises(SettingsError, match="RECEIPT_WORKER_LOST_TIMEOUT_MS"):
            Settings.load({"RECEIPT_WORKER_LOST_TIMEOUT_MS": bad})
