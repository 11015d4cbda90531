"""`receipts.jobs.lease_patch`: which appends may go to the narrow lease row instead of the jobs
row, and that the patch laid over the old state gives exactly the new one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from receipts.jobs import Job, Receipt, fold, job_stream, lease_patch

JOB_ID = "job-1"
T0 = datetime(2025, 1, 1, tzinfo=UTC)
W1 = f"{JOB_ID}:attempt:1/1"
W1B = f"{JOB_ID}:attempt:1/2"


def receipt(seq: int, type_: str, **data: Any) -> Receipt:
    return Receipt(job_stream(JOB_ID), seq, type_, data, T0 + timedelta(seconds=seq))


def running() -> Job:
    job = fold(
        [
            receipt(1, "job.enqueued", jobId=JOB_ID, agentId="codex", kind="factory.task.run"),
            receipt(2, "job.leased", workerId=W1, expiresAt=(T0 + timedelta(hours=1)).isoformat()),
            receipt(3, "job.heartbeat", workerId=W1, attempt=1, expiresAt="2025-01-01T01:00:00Z"),
        ]
    )
    assert job is not None and job.status == "running"
    return job


def then(job: Job, type_: str, **data: Any) -> Job:
    after = fold([receipt(job.seq + 1, type_, **data)], job)
    assert after is not None
    return after


def overlay(before: Job, patch: dict[str, Any]) -> Job:
    return Job.model_validate({**before.to_json(), **patch})


def test_a_plain_heartbeat_is_a_patch_that_gives_the_new_state() -> None:
    before = running()
    after = then(before, "job.heartbeat", workerId=W1, attempt=1, expiresAt="2025-01-01T02:00:00Z")
    patch = lease_patch(before, after)
    assert patch is not None
    assert set(patch) == {"seq", "updatedAt", "lastHeartbeatAt", "lease"}
    assert overlay(before, patch) == after


def test_a_refused_heartbeat_moves_only_the_head_and_is_a_patch_too() -> None:
    before = running()
    after = then(before, "job.heartbeat", workerId="someone-else", attempt=1)
    patch = lease_patch(before, after)
    assert patch is not None and overlay(before, patch) == after


def test_everything_else_rewrites_the_jobs_row() -> None:
    before = running()
    rewrites = [
        # a redelivery's start fence rebinds the lease to another worker
        then(before, "job.heartbeat", workerId=W1B, attempt=1, startFence=True),
        then(before, "job.progress", workerId=W1, attempt=1, data={"line": 1}),
        then(before, "job.completed", workerId=W1, attempt=1, result=1),
        then(before, "queue.command", commandId="c1", type="abort"),
    ]
    for after in rewrites:
        assert lease_patch(before, after) is None, after
    leased = fold(
        [
            receipt(1, "job.enqueued", jobId=JOB_ID, agentId="codex", kind="factory.task.run"),
            receipt(2, "job.leased", workerId=W1, expiresAt="2025-01-01T01:00:00Z"),
        ]
    )
    assert leased is not None and leased.status == "leased"
    # The first heartbeat turns leased into running: a status change.
    assert lease_patch(leased, then(leased, "job.heartbeat", workerId=W1, attempt=1)) is None
    assert lease_patch(None, leased) is None
