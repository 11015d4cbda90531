"""Which channels an append is announced on (receipts/notices.py): a notice reaches the
processes of its concern only."""

from __future__ import annotations

import pytest

from receipts.notices import AGENT_JOBS, COMMANDS, DISPATCH, OBJECTIVES, STREAMS, channels


@pytest.mark.parametrize(
    ("stream", "types", "expected"),
    [
        ("jobs/j", ["job.enqueued"], [STREAMS, DISPATCH]),
        ("jobs/j", ["job.leased", "job.heartbeat"], [STREAMS]),
        ("jobs/j", ["job.heartbeat"], [STREAMS]),
        ("jobs/j", ["job.progress"], [STREAMS]),
        ("jobs/j", ["queue.command"], [STREAMS, COMMANDS]),
        ("jobs/j", ["queue.command.consumed"], [STREAMS]),
        ("jobs/j", ["job.completed"], [STREAMS, DISPATCH, AGENT_JOBS]),
        ("jobs/j", ["queue.command.unconsumed", "job.failed"], [STREAMS, DISPATCH, AGENT_JOBS]),
        ("jobs/j", ["job.lease_expired"], [STREAMS, DISPATCH, AGENT_JOBS]),
        ("agent-jobs/a", ["agent_job.created"], [STREAMS, AGENT_JOBS]),
        ("objectives/o", ["objective.control_requested"], [STREAMS, OBJECTIVES]),
        ("objectives/o", ["objective.task.dispatched"], [STREAMS]),
        ("sessions/s", ["session.wakeup"], [STREAMS]),
    ],
)
def test_each_append_reaches_the_channels_of_its_concern(
    stream: str, types: list[str], expected: list[str]
) -> None:
    assert channels(stream, types) == expected


def test_a_takeover_reaches_the_watcher_of_the_attempt_it_took_over() -> None:
    """A start-fence heartbeat (a later delivery took the lease over) is announced to the
    watcher of the running attempt; the holder's own heartbeats are not (one a lease cadence)."""
    assert channels("jobs/j", ["job.heartbeat"], takeover=True) == [STREAMS, COMMANDS]
    assert channels("jobs/j", ["job.heartbeat"]) == [STREAMS]
