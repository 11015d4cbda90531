"""`ScheduleFireWorkflow`: what a schedule's Temporal Schedule starts at each fire time; one
activity enqueues the firing's job (or records why not) through the receipts."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey

with workflow.unsafe.imports_passed_through():
    from activities.names import FIRE_SCHEDULE, SCHEDULE_FIRE_WORKFLOW

SCHEDULED_START = SearchAttributeKey.for_datetime("TemporalScheduledStartTime")
# A firing is retried through a database outage this long (a restart, a failover), then lost:
# Temporal shows the run failed. Time-bounded, not count-bounded: ten quick tries were gone in
# about two minutes.
FIRE_PATIENCE = timedelta(minutes=30)
FIRE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=0,
)


@workflow.defn(name=SCHEDULE_FIRE_WORKFLOW)
class ScheduleFireWorkflow:
    """Fire the schedule `schedule_id` (the runtime's id) at this run's scheduled time."""

    @workflow.run
    async def run(self, schedule_id: str) -> str:
        scheduled = workflow.info().typed_search_attributes.get(SCHEDULED_START)
        when = (scheduled or workflow.now()).replace(microsecond=0).isoformat()
        outcome: str = await workflow.execute_activity(
            FIRE_SCHEDULE,
            args=[schedule_id, when],
            result_type=str,
            start_to_close_timeout=timedelta(seconds=30),
            schedule_to_close_timeout=FIRE_PATIENCE,
            retry_policy=FIRE_RETRY,
        )
        return outcome
