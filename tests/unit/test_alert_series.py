"""The series an alert counts with `increase()` exist at 0 before their first event: a series
born at 1 reads an increase of 0, so the first slow pass, failed callback or failed job of each
process was left out of what the alert counts (deploy/prometheus/receipt-rules.yaml)."""

from __future__ import annotations

from prometheus_client import REGISTRY

from activities.attempt import AttemptActivities
from activities.driver import DriverActivities
from activities.schedules import ScheduleActivities
from receipts.settings import Settings
from roles.delivery.agent_jobs import AgentJobDispatcher
from roles.delivery.loops import ObjectiveControlOutboxRedrive
from roles.infra.settings import LoopSettings


def exists(name: str, **labels: str) -> bool:
    return REGISTRY.get_sample_value(name, labels) is not None


async def nothing() -> int:
    return 0


def test_each_counted_series_is_there_from_the_start() -> None:
    ObjectiveControlOutboxRedrive.of(nothing, LoopSettings())
    assert exists("receipt_loop_slow_passes_total", loop="objective_control_outbox_redrive")
    settings = Settings(RECEIPT_EVENT_CALLBACK_URL="http://127.0.0.1:9/hook")
    DriverActivities(None, settings, None)  # type: ignore[arg-type]
    for event in ("dispatched", "completed", "failed", "canceled"):
        assert exists("receipt_callbacks_total", event=event, outcome="failed"), event
    AttemptActivities(None, {"release-bot": None})  # type: ignore[arg-type, dict-item]
    for agent in ("other",):
        assert exists("receipt_jobs_finished_total", agent=agent, status="failed"), agent
    AgentJobDispatcher(None, None)  # type: ignore[arg-type]
    assert exists("receipt_agent_job_dispatch_actions_total", action="failed")
    ScheduleActivities(None)  # type: ignore[arg-type]
    assert exists("receipt_schedule_firings_total", outcome="error")
