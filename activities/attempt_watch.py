"""What a running attempt watches for besides its handler (`activities/attempt.py`): commands
and a takeover announced on its job's notices, and, once Temporal cancelled it (detached), a
later delivery that took its lease over."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from temporalio import activity

from activities.fence import AttemptFence
from receipts.jobs import Job, job_stream
from receipts.listen import RECONNECTED

log = logging.getLogger("activities.attempt")

# How often a detached attempt (Temporal cancelled it; it runs on under its lease) looks for a
# redelivery that took its lease over.
TAKEOVER_CHECK_S = 2.0
# How long a delivery that took a lease over waits before it starts the handler: the earlier
# delivery, told of the takeover by its notice, stops its own in that time (within
# milliseconds in tests/e2e/test_outages.py). Every redelivery pays it, a dead worker's too
# (the bench's recovery goal counts it).
TAKEOVER_GRACE_S = 0.5


def taken_over(job: Job | None, fence: AttemptFence) -> bool:
    """Whether another delivery holds the job's lease now (a later one took it over)."""
    return job is not None and job.lease is not None and job.lease.worker_id != fence.worker_id


async def until_taken_over(fence: AttemptFence) -> None:
    """Return once the job is plainly no longer this delivery's (a detached attempt's check:
    Temporal redelivered the attempt to another worker, which took the lease over, and maybe
    settled the job since): another delivery holds its lease, or it is settled at two looks in
    a row (the attempt's own settle ends the attempt between them) or gone. A read that fails
    (the database away) answers nothing: looked at again."""
    settled_before = False
    while True:
        await asyncio.sleep(TAKEOVER_CHECK_S)
        try:
            job = await fence.read()
        except Exception as exc:
            log.warning(
                "a detached attempt could not read its job: %s",
                exc,
                extra={"event": "attempt.detached_read_failed", "jobId": fence.job_id},
            )
            continue
        if job is None:
            return
        if taken_over(job, fence):
            return
        settled = job.terminal
        if settled and settled_before:
            return
        settled_before = settled


async def watch_commands(
    queue: asyncio.Queue[Any], job_id: str, wake: asyncio.Event, arrived: asyncio.Event
) -> None:
    """Wake the attempt's heartbeat loop (`wake`: it reads the job) on its job's notices: a
    command appended (`arrived` too: the handler's hint to read its commands), a later delivery
    taking the lease over, a reconnect of the listener (a notice may have been lost)."""
    stream = job_stream(job_id)
    while True:
        notice = await queue.get()
        if notice is RECONNECTED or (notice.stream == stream and "queue.command" in notice.types):
            wake.set()
            arrived.set()
        elif notice.stream == stream and "job.heartbeat" in notice.types:
            wake.set()  # a later delivery took the lease over (a start-fence heartbeat)


def cancel_reason(details: activity.ActivityCancellationDetails | None) -> str:
    """Why Temporal cancelled an activity, as a metric label."""
    if details is None:
        return "unknown"
    for reason in ("timed_out", "not_found", "cancel_requested", "paused", "reset"):
        if getattr(details, reason):
            return reason
    return "unknown"
