"""What several metric families count together when one outcome is known: an enqueue, an
attempt's start and settle, a driver's start (the families are receipts/metrics.py's)."""

from __future__ import annotations

from receipts import metrics
from receipts.jobs import Job
from receipts.kinds import route, route_disagrees


def job_enqueued(
    lane: str, kind: str, agent_id: str, outcome: str, idempotency_mismatch: bool = False
) -> None:
    """An accepted enqueue; a created job whose route and contract disagree, and a re-post with
    another agent or payload, are counted too."""
    agent = metrics.agent_label(agent_id)
    metrics.JOBS_ENQUEUED.labels(lane, kind, agent, outcome).inc()
    if idempotency_mismatch:
        metrics.IDEMPOTENCY_MISMATCHES.labels(agent).inc()
    if outcome == "created" and route_disagrees(agent_id, kind):
        metrics.ROUTE_DISAGREEMENTS.labels(agent, kind).inc()


def attempt_started(
    job: Job, redelivered: bool, *, leased: bool = True, again: bool = False
) -> None:
    """An attempt took its lease or its start-fence (`redelivered`: a later delivery), and, when
    this start leased the job's first attempt (`leased`: it wrote `job.leased`, not a takeover
    of a lease an earlier delivery took), how long after it was due the job was leased.
    `again`: it leased a job an earlier delivery gave back at its worker's shutdown (attempt
    refunded): not a lost worker's redelivery, and not the job's first lease."""
    labels = (route(job.agent_id, job.kind), metrics.agent_label(job.agent_id))
    metrics.ATTEMPTS_STARTED.labels(*labels).inc()
    if redelivered and not again:
        metrics.REDELIVERIES.labels(*labels).inc()
    if job.lease is not None and job.attempt == 1 and leased and not again:
        due = max(job.created_at, job.available_at or job.created_at)
        metrics.ENQUEUE_TO_START.observe(max(0.0, (job.lease.leased_at - due).total_seconds()))


def attempt_settled(status: str, job: Job | None, handler_s: float | None) -> None:
    """A delivery settled (or was refused) with `status`: by the job's and the attempt's status,
    the job's age at settlement, the handler's run time."""
    metrics.JOBS_SETTLED.labels(job.status if job else "", status).inc()
    if job is None:
        return
    if job.settled_at is not None:
        metrics.ENQUEUE_TO_SETTLE.observe(
            max(0.0, (job.settled_at - job.created_at).total_seconds())
        )
        if status == job.status:  # this settlement ended the job (not a refusal after another)
            metrics.JOBS_FINISHED.labels(metrics.agent_label(job.agent_id), job.status).inc()
    if handler_s is not None:
        metrics.HANDLER_DURATION.labels(metrics.agent_label(job.agent_id)).observe(handler_s)


def driver_started(outcome: str, generation: int | None) -> None:
    """What one start of a job's driver did."""
    metrics.DRIVER_STARTS.labels(outcome).inc()
    if outcome == "active_delivery":
        metrics.ACTIVE_DELIVERY_REFUSALS.inc()
    if outcome == "created" and generation:
        metrics.GENERATION_ADVANCES.inc()
