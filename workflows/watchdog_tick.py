"""`WatchdogTickWorkflow`: what the watchdog Schedule starts each tick; it enqueues one job."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey

with workflow.unsafe.imports_passed_through():
    from activities.names import ENQUEUE_WATCHDOG, WATCHDOG_TICK_WORKFLOW

SCHEDULED_START = SearchAttributeKey.for_datetime("TemporalScheduledStartTime")


@workflow.defn(name=WATCHDOG_TICK_WORKFLOW)
class WatchdogTickWorkflow:
    """Enqueue the `factory.objective.watchdog` job `watchdog:<scheduledTime>` for this tick."""

    @workflow.run
    async def run(self) -> str:
        scheduled = workflow.info().typed_search_attributes.get(SCHEDULED_START)
        when = (scheduled or workflow.now()).replace(microsecond=0).isoformat()
        job_id: str = await workflow.execute_activity(
            ENQUEUE_WATCHDOG,
            when,
            result_type=str,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=5),
        )
        return job_id
