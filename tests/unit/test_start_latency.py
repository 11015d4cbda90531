"""`receipt_enqueue_to_start_seconds` is the wait for a worker: from a job's due time (its
enqueue, or the availableAt it asked for) to its first lease — never the delay a job asked for,
nor a retry's backoff and earlier attempts (the start-latency alert reads it)."""

from __future__ import annotations

from datetime import timedelta

from receipts import metric_counts, metrics
from receipts.jobs import Job, Receipt, fold, job_stream
from tests.unit.test_reducer import JOB_ID, T0, W1, W2, enqueued, failed, leased


def folded(*events: tuple[str, dict[str, object]], seconds: list[int]) -> Job:
    receipts = [
        Receipt(job_stream(JOB_ID), n + 1, kind, dict(data), T0 + timedelta(seconds=s))
        for n, ((kind, data), s) in enumerate(zip(events, seconds, strict=True))
    ]
    job = fold(receipts)
    assert job is not None
    return job


def observed(
    job: Job, redelivered: bool = False, leased: bool = True, again: bool = False
) -> float:
    before = metrics.ENQUEUE_TO_START._sum.get()
    metric_counts.attempt_started(job, redelivered=redelivered, leased=leased, again=again)
    # Rounded: the sum is shared with every test of the process before, and a large float sum
    # loses the difference's last bits.
    return round(metrics.ENQUEUE_TO_START._sum.get() - before, 6)


def test_the_wait_runs_from_the_due_time_to_the_first_lease() -> None:
    prompt = folded(enqueued(), leased(W1, 1), seconds=[0, 4])
    assert observed(prompt) == 4.0
    due_later = (T0 + timedelta(seconds=90)).isoformat()
    delayed = folded(enqueued(availableAt=due_later), leased(W1, 1), seconds=[0, 92])
    assert observed(delayed) == 2.0  # not the 90 s the job asked to wait
    assert observed(delayed, redelivered=True, leased=False) == 0.0  # a takeover: once
    # A later delivery that leased the job (the first one was lost before its lease): counted.
    assert observed(delayed, redelivered=True, leased=True) == 2.0


def test_a_later_attempt_is_not_counted() -> None:
    retried = folded(
        enqueued(),
        leased(W1, 1),
        failed(W1, 1, error="boom", retryable=True),
        leased(W2, 2),
        seconds=[0, 1, 60, 300],
    )
    assert retried.attempt == 2
    assert observed(retried) == 0.0


def test_a_lease_again_after_a_release_at_shutdown_is_not_counted() -> None:
    """A worker's SIGTERM gave the job back (attempt refunded) and another leased attempt 1
    again: its wait for a worker was the first lease's, not the first run's length."""
    released = folded(
        enqueued(),
        leased(W1, 1),
        failed(W1, 1, error="worker shutdown", retryable=True, refund=True),
        leased(W2, 1),
        seconds=[0, 1, 600, 601],
    )
    assert released.attempt == 1
    assert observed(released, redelivered=True, again=True) == 0.0
