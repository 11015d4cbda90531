"""The schedule firing's activity: enqueue the firing's job through the receipts
(receipts/schedules/firing.py `fire`), idempotent by its fire time."""

from __future__ import annotations

import logging
from datetime import datetime

from opentelemetry import trace
from temporalio import activity

from activities.names import FIRE_SCHEDULE
from receipts import metrics
from receipts.schedules import firing
from receipts.store import Store
from receipts.trace_context import current_traceparent

log = logging.getLogger("activities.schedules")
_tracer = trace.get_tracer("receipt.schedules")


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
        # The job a firing enqueues starts its trace here, as a post without a `traceparent`
        # does at the api: the firing's span is its parent (in the schedule's workflow trace
        # while Temporal's interceptor carries one).
        attributes = {"receipt.schedule_id": schedule_id, "receipt.fire_time": fire_time}
        try:
            with _tracer.start_as_current_span(
                "receipt.schedule.fire", attributes=attributes
            ) as span:
                fired = await firing.fire(
                    self.store,
                    schedule_id,
                    datetime.fromisoformat(fire_time),
                    self.caps,
                    traceparent=current_traceparent(),
                )
                span.set_attribute("receipt.outcome", fired)
                return fired
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
