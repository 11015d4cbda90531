"""The watchdog Schedule, owned by the worker-control role: create, update or pause it."""

from __future__ import annotations

import asyncio
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
from temporalio.service import RPCError

from activities.names import WATCHDOG_TICK_WORKFLOW
from receipts import metrics
from receipts.kinds import QUEUE_CONTROL
from receipts.objectives.watchdog import WatchdogSettings
from receipts.settings import Settings

log = logging.getLogger("roles.delivery.watchdog_schedule")

SCHEDULE_ID = "receipt-factory-objective-watchdog"
# A write Temporal refused is tried again this often, until written (`keep_watchdog_schedule`).
RETRY_S = 60.0
LOOP = "watchdog_schedule"  # its failures' `loop` label


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


async def keep_watchdog_schedule(
    client: Client, settings: Settings, watchdog: WatchdogSettings
) -> str:
    """`ensure_watchdog_schedule` until Temporal takes it, every RETRY_S; return its id. Each
    refusal is logged (`watchdog.schedule_failed`) and counted as a loop's failure: with no
    Schedule the watchdog never ticks, and an objective no job's end asks control for waits."""
    metrics.LOOP_FAILED.labels(LOOP)  # from 0: an alert's increase() sees the first
    while True:
        try:
            return await ensure_watchdog_schedule(client, settings, watchdog)
        except RPCError as exc:
            metrics.LOOP_FAILED.labels(LOOP).inc()
            log.error(
                "could not create or update the watchdog schedule; trying again in %g s",
                RETRY_S,
                extra={"event": "watchdog.schedule_failed", "loop": LOOP, "error": str(exc)},
            )
        await asyncio.sleep(RETRY_S)
