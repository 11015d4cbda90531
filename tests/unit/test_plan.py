"""`receipts.plan.next_step` (pure): what happens next to a job, for the starter, the driver
and the lease alike."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from receipts.jobs import Job, Lease
from receipts.plan import NEEDS_DELIVERY, Slots, Step, available, next_step

NOW = datetime(2026, 1, 1, tzinfo=UTC)
EXPIRES = NOW + timedelta(minutes=5)
STALE_MS = 600_000


def job(**changes: object) -> Job:
    base = Job(
        job_id="j",
        agent_id="codex",
        lane="collect",
        kind="factory.task.run",
        payload={},
        created_at=NOW,
        updated_at=NOW,
    )
    return base.model_copy(update=changes)


def running(heartbeat_at: datetime = NOW, expires_at: datetime = EXPIRES) -> Job:
    lease = Lease(worker_id="j:attempt:1/1", attempt=1, expires_at=expires_at, leased_at=NOW)
    return job(status="running", attempt=1, lease=lease, last_heartbeat_at=heartbeat_at)


CASES = [
    pytest.param(None, NOW, Step.MISSING, 0, id="missing"),
    pytest.param(job(status="completed"), NOW, Step.TERMINAL, 0, id="terminal"),
    pytest.param(job(), NOW, Step.DELIVER, 1, id="queued"),
    pytest.param(job(attempt=1), NOW, Step.DELIVER, 2, id="requeued"),
    pytest.param(job(abort_requested=True), NOW, Step.ABORT, 1, id="abort-requested"),
    pytest.param(job(available_at=NOW + timedelta(seconds=1)), NOW, Step.NOT_AVAILABLE, 1),
    pytest.param(job(available_at=NOW), NOW, Step.DELIVER, 1, id="available-now"),
    pytest.param(running(), NOW, Step.ACTIVE, 0, id="active"),
    pytest.param(running(), EXPIRES + timedelta(microseconds=1), Step.EXPIRED, 0, id="expired"),
    pytest.param(
        running(expires_at=NOW + timedelta(hours=1)),
        NOW + timedelta(milliseconds=STALE_MS + 1),
        Step.STALE,
        0,
        id="stale",
    ),
    # Without the database clock nothing is judged expired, stale or available by time.
    pytest.param(running(), None, Step.ACTIVE, 0, id="no-clock-lease"),
    pytest.param(job(available_at=NOW - timedelta(days=1)), None, Step.NOT_AVAILABLE, 1),
    pytest.param(job(), None, Step.DELIVER, 1, id="no-clock-queued"),
]


@pytest.mark.parametrize(("state", "now", "step", "attempt"), CASES)
def test_next_step(state: Job | None, now: datetime | None, step: Step, attempt: int) -> None:
    planned = next_step(state, now, STALE_MS)
    assert (planned.step, planned.attempt) == (step, attempt)
    assert planned.needs_delivery == (step in (Step.DELIVER, Step.ABORT))


def test_waits_say_until_when() -> None:
    later = NOW + timedelta(seconds=30)
    assert next_step(running(), NOW).until == EXPIRES
    assert next_step(job(available_at=later), NOW).until == later


def test_the_stale_window_applies_only_when_given() -> None:
    silent = running(expires_at=NOW + timedelta(hours=1))
    much_later = NOW + timedelta(minutes=30)
    assert next_step(silent, much_later, STALE_MS).step is Step.STALE
    assert next_step(silent, much_later).step is Step.ACTIVE


def test_deliverable_steps_and_availability() -> None:
    assert frozenset({Step.DELIVER, Step.ABORT}) == NEEDS_DELIVERY
    assert available(job(), None)
    assert not available(job(available_at=NOW), None)
    assert available(job(available_at=NOW), NOW)


def test_a_deliverable_job_is_held_while_its_organization_holds_every_slot() -> None:
    assert next_step(job(), NOW, slots=Slots(held=2, cap=2)).step is Step.HELD
    assert next_step(job(), NOW, slots=Slots(held=1, cap=2)).step is Step.DELIVER
    assert next_step(job(), NOW, slots=Slots(held=50, cap=0)).step is Step.DELIVER  # no cap
    assert not next_step(job(), NOW, slots=Slots(2, 2)).needs_delivery


def test_only_a_deliverable_job_is_held() -> None:
    full = Slots(held=3, cap=3)
    # An abort takes no worker; a delayed job waits for its time; a lease owns its slot.
    assert next_step(job(abort_requested=True), NOW, slots=full).step is Step.ABORT
    later = job(available_at=NOW + timedelta(seconds=1))
    assert next_step(later, NOW, slots=full).step is Step.NOT_AVAILABLE
    assert next_step(running(), NOW, slots=full).step is Step.ACTIVE
    assert next_step(job(status="completed"), NOW, slots=full).step is Step.TERMINAL
