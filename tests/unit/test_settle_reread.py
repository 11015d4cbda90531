"""The attempt's re-read before settling (pure): what a re-read job forbids."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from activities.attempt import reread_rejection
from receipts.jobs import Job, Lease

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


def test_the_holder_may_settle() -> None:
    assert reread_rejection(job(), "j:attempt:1/1", 1) is None


def test_a_settled_job_forbids_it_unless_it_is_our_own_settlement() -> None:
    settled = job(status="completed", lease=None, settlement_id="j:attempt:1/1")
    assert reread_rejection(settled, "j:attempt:1/1", 1) is None
    assert reread_rejection(settled, "j:attempt:1/2", 1) == "terminal_state"


def test_a_rebound_or_newer_lease_forbids_it() -> None:
    assert reread_rejection(job(), "j:attempt:1/2", 1) == "lease_lost"
    assert reread_rejection(job(attempt=2), "j:attempt:1/1", 1) == "stale_attempt"
    assert reread_rejection(job(status="queued", lease=None), "j:attempt:1/1", 1) == "lease_lost"
    assert reread_rejection(None, "j:attempt:1/1", 1) == "not_found"
