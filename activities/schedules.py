"""The schedule firing's activity: enqueue the firing's job through the receipts
(receipts/schedules/firing.py `fire`), idempotent by its fire time."""

from __future__ import annotations

import logging
from datetime import datetime

from temporalio import activity

from activities.names import FIRE_SCHEDULE
from receipts import metrics
from receipts.schedules import firing
from receipts.store import Store

log = logging.getLogger("activities.schedules")


class ScheduleActivities:
    """Activities of the schedule firings (registered by the worker-control role)."""

    def __init__(self, store: Store, caps: firing.Caps | None = None) -> None:
        self.store = store
        self.caps = caps
        metrics.SCHEDULE_FIRINGS.labels("error")  # from 0: an alert's increase() sees the first

    @activity.defn(name=FIRE_SCHEDULE)
    async def fire_schedule(self, schedule_id: str, fire_time: str) -> str:
        """Fire `schedule_id` at `fire_time` (ISO 8601); return what the firing came to. A try
        that raises (the database away) is logged and counted `error`; Temporal tries again
        for workflows/schedule_fire.py FIRE_PATIENCE, then the firing is lost (its run
        failed)."""
        try:
            return await firing.fire(
                self.store, schedule_id, datetime.fromisoformat(fire_time), self.caps
            )
        except Exception as exc:
            metrics.SCHEDULE_FIRINGS.labels("error").inc()
            log.warning(
                "schedule firing failed; Temporal tries it again",
                extra={
                    "event": "schedule.fire_failed",
                    "scheduleId": schedule_id,
                    "fireTime": fire_time,
                    "try": activity.info().attempt,
                    "error": f"{type(exc).__name__}: {exc}",
                },
            )
            raise
