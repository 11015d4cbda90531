"""`JobAttemptWorkflow`: one attempt of one job as a child workflow — kept only to drain.

Builds before 2026-12 ran every attempt as this child of the driver; the driver now schedules
the `execute_attempt` activity itself (workflows/driver.py). The worker roles still register
this workflow so that attempts started by an older driver finish after an upgrade; it is
removed once no such driver can be open (README, "Upgrading").
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.names import EXECUTE_ATTEMPT, JOB_ATTEMPT_WORKFLOW
    from receipts.messages import AttemptInput, AttemptResult, AttemptStatus

# Time the activity may spend around the handler: lease/start-fence, re-read, settle retries
# (the driver's own margin, workflows/driver.py).
SETTLE_MARGIN = timedelta(seconds=30)
# The least a child attempt's every delivery together may take (its schedule-to-close timeout);
# the driver's window for an attempt activity is its own `MIN_ATTEMPT_WINDOW`.
CHILD_MIN_SCHEDULE_TO_CLOSE = timedelta(hours=1)


@workflow.defn(name=JOB_ATTEMPT_WORKFLOW)
class JobAttemptWorkflow:
    """Run attempt `n` of a job: lease (or start-fence), handler, heartbeats, fenced settle.

    Lease, heartbeat loop, execution, re-read and settle live in one activity so an attempt
    costs one Temporal hop. Temporal redelivers that activity (bounded by `deliveries`) when
    its worker stops heartbeating; the redelivery takes a start-fence heartbeat, so the fence,
    not Temporal, decides which delivery may settle.
    """

    @workflow.run
    async def run(self, attempt: AttemptInput) -> AttemptResult:
        heartbeat_timeout = timedelta(milliseconds=2 * attempt.heartbeat_ms)
        try:
            result: AttemptResult = await workflow.execute_activity(
                EXECUTE_ATTEMPT,
                attempt,
                result_type=AttemptResult,
                start_to_close_timeout=timedelta(milliseconds=attempt.lease_ms) + SETTLE_MARGIN,
                # No schedule-to-start bound: an attempt may wait for a worker to exist. The
                # whole attempt is bounded, so a task lost inside Temporal cannot hold it open.
                schedule_to_close_timeout=max(
                    CHILD_MIN_SCHEDULE_TO_CLOSE,
                    (timedelta(milliseconds=attempt.lease_ms) + SETTLE_MARGIN)
                    * max(1, attempt.deliveries)
                    * 2,
                ),
                heartbeat_timeout=heartbeat_timeout,
                retry_policy=RetryPolicy(
                    maximum_attempts=max(1, attempt.deliveries),
                    initial_interval=timedelta(milliseconds=200),
                    non_retryable_error_types=["NonRetryable"],
                ),
                summary=f"attempt {attempt.attempt} of {attempt.job_id}",
            )
            return result
        except ActivityError as exc:
            # Every delivery died (or timed out): the lease stays until it expires, then the
            # driver or the recovery scan requeues the job with the next attempt.
            cause = exc.cause or exc
            return AttemptResult(
                status=AttemptStatus.LEASE_LOST,
                error=f"deliveries exhausted: {cause}",
                retryable=True,
            )
