"""The settle rule (pure): what a re-read job forbids. The worker's re-read before settling and
the settle operations apply this one function (`receipts.jobs.settle_rejection`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from receipts.jobs import Job, Lease, settle_rejection

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def job(**changes: object) -> Job:
    base = Job(
        job_id="j",
        agent_id="codex",
        lane="collect",
        kind="factory.task.run",
        payload={},
        status="running",
        attempt=1,
        created_at=NOW,
        updated_at=NOW,
        lease=Lease(
            worker_id="j:attempt:1/1",
            attempt=1,
            expires_at=NOW + timedelta(minutes=5),
            leased_at=NOW,
        ),
    )
    return base.model_copy(update=changes)


def reread_rejection(
    job: Job | None, worker_id: str, now: datetime = NOW + timedelta(minutes=1)
) -> str | None:
    """The worker's re-read of attempt 1 as delivery `worker_id` at the database clock `now`."""
    return settle_rejection(job, worker_id, 1, now, worker_id)


def test_the_holder_may_settle() -> None:
    assert reread_rejection(job(), "j:attempt:1/1") is None


def test_a_settled_job_forbids_it_unless_it_is_our_own_settlement() -> None:
    settled = job(status="completed", lease=None, settlement_id="j:attempt:1/1")
    assert reread_rejection(settled, "j:attempt:1/1") is None
    assert reread_rejection(settled, "j:attempt:1/2") == "terminal_state"


def test_a_rebound_or_newer_lease_forbids_it() -> None:
    assert reread_rejection(job(), "j:attempt:1/2") == "lease_lost"
    assert reread_rejection(job(attempt=2), "j:attempt:1/1") == "stale_attempt"
    assert reread_rejection(job(status="queued", lease=None), "j:attempt:1/1", 1) == "lease_lost"
    assert reread_rejection(None, "j:attempt:1/1") == "not_found"


def test_a_lease_the_database_clock_has_passed_forbids_it() -> None:
    # The same rule as the settle operation: expired is lost, even before the recovery scan
    # appends `job.lease_expired` (the re-read used to miss this and report the refused write
    # as a settlement conflict).
    expires = NOW + timedelta(minutes=5)
    assert reread_rejection(job(), "j:attempt:1/1", expires) is None
    expired_at = expires + timedelta(microseconds=1)
    assert reread_rejection(job(), "j:attempt:1/1", expired_at) == "lease_lost"
    settled = job(status="completed", lease=None, settlement_id="j:attempt:1/1")
    assert reread_rejection(settled, "j:attempt:1/1", expired_at) is None
