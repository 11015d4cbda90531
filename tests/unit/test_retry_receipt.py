"""The reducer's `job.retried`: links a terminal job to its retry once, moves nothing."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from receipts.errors import InvariantError
from receipts.jobs import RETRIED, Receipt, apply, fold

AT = datetime(2026, 1, 1, tzinfo=UTC)


def receipt(seq: int, type_: str, **data: object) -> Receipt:
    return Receipt("jobs/j1", seq, type_, data, AT)


ENQUEUED = receipt(1, "job.enqueued", jobId="j1", agentId="codex", payload={"kind": "k"})
FAILED = receipt(
    2, "job.failed", workerId=None, attempt=0, error="x", retryable=False, status="failed"
)


def test_a_terminal_job_records_its_first_retry_and_stays_terminal() -> None:
    job = fold([ENQUEUED, FAILED, receipt(3, RETRIED, retriedAs="r1")])
    assert job is not None and job.status == "failed" and job.retried_as == "r1"
    again = apply(job, receipt(4, RETRIED, retriedAs="r2"))
    assert again is not None and again.retried_as == "r1" and again.seq == 4


def test_retried_is_inert_on_an_active_job_and_fatal_on_a_missing_one() -> None:
    job = fold([ENQUEUED, receipt(2, RETRIED, retriedAs="r1")])
    assert job is not None and job.status == "queued" and job.retried_as is None
    with pytest.raises(InvariantError, match="no job for j1"):
        apply(None, receipt(1, RETRIED, retriedAs="r1"))


def test_the_retry_carries_retry_of() -> None:
    job = fold(
        [
            Receipt(
                "jobs/r1", 1, "job.enqueued", {**ENQUEUED.data, "jobId": "r1", "retryOf": "j1"}, AT
            )
        ]
    )
    assert job is not None and job.retry_of == "j1"
