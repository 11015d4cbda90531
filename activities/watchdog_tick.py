"""The watchdog tick's activity: enqueue the tick's job through the ordinary enqueue path."""

from __future__ import annotations

import dataclasses

from opentelemetry import trace
from temporalio import activity

from activities.names import ENQUEUE_WATCHDOG
from receipts.enqueue import enqueue, parse_enqueue
from receipts.objectives.watchdog import WATCHDOG_AGENT, WATCHDOG_KIND, watchdog_job_id
from receipts.store import Store
from receipts.trace_context import current_traceparent

_tracer = trace.get_tracer("receipt.watchdog")


class WatchdogActivities:
    """Activities of the watchdog tick (registered by the worker-control role)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @activity.defn(name=ENQUEUE_WATCHDOG)
    async def enqueue_watchdog(self, scheduled_time: str) -> str:
        """Enqueue `watchdog:<scheduledTime>` (idempotent by job id); return the job id."""
        request = parse_enqueue(
            WATCHDOG_AGENT,
            {
                "jobId": watchdog_job_id(scheduled_time),
                "payload": {"kind": WATCHDOG_KIND},
                "maxAttempts": 1,
            },
            system=True,
        )
        # The tick's job starts its trace here (as a schedule firing's does), under this span.
        with _tracer.start_as_current_span("receipt.watchdog.tick"):
            traced = dataclasses.replace(request, traceparent=current_traceparent())
            result = await enqueue(self.store, traced)
        return result.job.job_id
