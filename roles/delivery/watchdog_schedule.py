"""The watchdog Schedule, owned by the worker-control role: create, update or pause it."""

from __future__ import annotations

import logging
from datetime import timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
    ScheduleUpdate,
    ScheduleUpdateInput,
)

from activities.names import WATCHDOG_TICK_WORKFLOW
from receipts.kinds import QUEUE_CONTROL
from receipts.objectives.watchdog import WatchdogSettings
from receipts.settings import Settings

log = logging.getLogger("roles.delivery.watchdog_schedule")

SCHEDULE_ID = "receipt-factory-objective-watchdog"


def schedule_id(settings: Settings) -> str:
    """The Schedule's id in this deployment (prefixed like the task queues)."""
    return settings.task_queue_prefix + SCHEDULE_ID


def build_schedule(settings: Settings, watchdog: WatchdogSettings) -> Schedule:
    """A Schedule that starts `WatchdogTickWorkflow` on receipt-control at the cron."""
    return Schedule(
        action=ScheduleActionStartWorkflow(
            WATCHDOG_TICK_WORKFLOW,
            id=schedule_id(settings) + "-tick",
            task_queue=settings.queue(QUEUE_CONTROL),
            execution_timeout=timedelta(milliseconds=watchdog.timeout_ms),
        ),
        spec=ScheduleSpec(cron_expressions=[watchdog.cron]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
        state=ScheduleState(
            paused=not watchdog.enabled,
            note="paused: RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_ENABLED=0"
            if not watchdog.enabled
            else "",
        ),
    )


async def ensure_watchdog_schedule(
    client: Client, settings: Settings, watchdog: WatchdogSettings
) -> str:
    """Create the Schedule, or bring an existing one in line with the settings; return its id."""
    wanted = build_schedule(settings, watchdog)
    sid = schedule_id(settings)
    try:
        await client.create_schedule(sid, wanted)
        action = "created"
    except ScheduleAlreadyRunningError:

        def update(_: ScheduleUpdateInput) -> ScheduleUpdate:
            return ScheduleUpdate(schedule=wanted)

        await client.get_schedule_handle(sid).update(update)
        action = "updated"
    log.info(
        "watchdog schedule %s",
        action,
        extra={
            "event": "watchdog.schedule_" + action,
            "cron": watchdog.cron,
            "paused": not watchdog.enabled,
        },
    )
    return sid
