"""The Temporal Schedule a schedule is written as (pure: roles/delivery/schedules.py `build`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta

import pytest
from temporalio.client import ScheduleActionStartWorkflow, ScheduleOverlapPolicy, ScheduleRange

from receipts.schedules import cron
from receipts.schedules.model import ScheduleState
from receipts.settings import Settings
from roles.delivery.schedules import build
from workflows.schedule_fire import FIRE_PATIENCE

NOW = datetime(2026, 12, 6, tzinfo=UTC)


def test_a_firings_run_outlives_its_activitys_patience_through_an_outage() -> None:
    """The fire activity retries through a database outage for FIRE_PATIENCE; the run that
    holds it must not be closed before (it was: a 5-minute run around 30 minutes of retries)."""
    state = ScheduleState.model_validate(
        {
            "scheduleId": "nightly~tag",
            "callerScheduleId": "nightly",
            "organizationId": "org-a",
            "status": "active",
            "cron": "0 3 * * *",
            "agentId": "codex",
            "job": {"payload": {"kind": "factory.task.run"}},
            "definitionSeq": 1,
            "createdAt": NOW,
            "updatedAt": NOW,
        }
    )
    action = build(Settings(), state).action
    assert isinstance(action, ScheduleActionStartWorkflow)
    assert action.execution_timeout is not None and action.execution_timeout > FIRE_PATIENCE


def _state(cron: str, **extra: object) -> ScheduleState:
    return ScheduleState.model_validate(
        {
            "scheduleId": "nightly~tag",
            "callerScheduleId": "nightly",
            "organizationId": "org-a",
            "status": "active",
            "cron": cron,
            "timezone": "Europe/Paris",
            "agentId": "codex",
            "job": {"payload": {"kind": "factory.task.run"}},
            "definitionSeq": 1,
            "createdAt": NOW,
            "updatedAt": NOW,
            **extra,
        }
    )


def _in(ranges: Sequence[ScheduleRange], value: int) -> bool:
    return any(
        r.start <= value <= max(r.end, r.start) and (value - r.start) % (r.step or 1) == 0
        for r in ranges
    )


@pytest.mark.parametrize(
    "expression", ["0 3 1,15 * mon", "30 4 * * 1-5", "0 0 13 * fri", "0 12 */10 jan,jul *"]
)
def test_the_temporal_calendars_fire_on_the_days_the_cron_names(expression: str) -> None:
    """README: both day fields restricted means either day, as in cron. Temporal's calendar
    matches all its fields at once, so the schedule it is written as must hold one calendar
    per day field: otherwise `0 3 1,15 * mon` fires only on a Monday the 1st or 15th."""
    spec = build(Settings(), _state(expression)).spec
    assert spec.time_zone_name == "Europe/Paris"
    parsed = cron.parse_cron(expression)
    day = date(2027, 1, 1)
    while day.year == 2027:
        written = any(
            _in(c.month, day.month)
            and _in(c.day_of_month, day.day)
            and _in(c.day_of_week, day.isoweekday() % 7)
            for c in spec.calendars
        )
        assert written == parsed.matches_day(day), (expression, day)
        day += timedelta(days=1)


def test_temporal_catches_up_a_minute_and_holds_a_pause() -> None:
    """README: a Temporal that was down fires what it missed in the last minute, not more
    (every firing it makes enqueues a job); a paused schedule is paused in Temporal too,
    with its note (the Temporal UI shows it as the receipts do)."""
    schedule = build(Settings(), _state("0 3 * * *", status="paused", note="release freeze"))
    assert schedule.policy.catchup_window == timedelta(minutes=1)
    assert schedule.policy.overlap == ScheduleOverlapPolicy.ALLOW_ALL
    assert schedule.state.paused and schedule.state.note == "release freeze"
    assert not build(Settings(), _state("0 3 * * *")).state.paused


async def test_a_failed_listing_of_temporals_schedules_is_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The check for schedules Temporal lost could not list them (Temporal refusing the call,
    its visibility store away): only a warning was logged, nothing counted, and a lost
    schedule was never written again, its firings missed with no alert to say so."""
    from temporalio.service import RPCError, RPCStatusCode

    from receipts import metrics
    from roles.delivery.schedules import ScheduleSync

    class Refusing:
        async def list_schedules(self) -> None:
            raise RPCError("visibility unavailable", RPCStatusCode.UNAVAILABLE, b"")

    sync = ScheduleSync(Refusing(), None, Settings(), 60.0)  # type: ignore[arg-type]
    # From 0 at the sync's start: the alert's increase() sees the first failure.
    for action in ("failed", "list_failed"):
        assert (
            metrics.REGISTRY.get_sample_value("receipt_schedule_syncs_total", {"action": action})
            is not None
        ), action
    before = metrics.value("receipt_schedule_syncs_total", action="list_failed")
    assert await sync._reconcile() == (0, 0)
    assert metrics.value("receipt_schedule_syncs_total", action="list_failed") == before + 1
    assert "schedule.list_failed" in {getattr(r, "event", None) for r in caplog.records}
