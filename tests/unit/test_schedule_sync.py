"""The Temporal Schedule a schedule is written as (pure: roles/delivery/schedules.py `build`)."""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio.client import ScheduleActionStartWorkflow

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
