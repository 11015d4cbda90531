"""Which channels an append is announced on (receipts/notices.py): a notice reaches the
processes of its concern only."""

from __future__ import annotations

import pytest

from receipts.notices import (
    AGENT_JOBS,
    COMMANDS,
    DISPATCH,
    OBJECTIVES,
    STREAMS,
    channels,
    dispatch_channel,
)


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


def test_a_job_that_names_its_queue_also_reaches_that_queues_dispatcher() -> None:
    own = dispatch_channel("receipt-chat")
    assert own == "receipts_dispatch_receipt_chat"  # a plain identifier: LISTEN needs no quotes
    assert channels("jobs/j", ["job.enqueued"], "receipt-chat") == [STREAMS, DISPATCH, own]
    assert channels("jobs/j", ["job.completed"], "receipt-chat") == [
        STREAMS,
        DISPATCH,
        own,
        AGENT_JOBS,
    ]
    # Only dispatch concerns: a heartbeat or a command names no dispatcher, whatever its queue.
    assert channels("jobs/j", ["job.heartbeat"], "receipt-chat") == [STREAMS]
    assert channels("jobs/j", ["queue.command"], "receipt-chat") == [STREAMS, COMMANDS]
