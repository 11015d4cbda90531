"""A new job in two round trips (receipts/enqueue.py `enqueue_new`, `enqueue_new` in
receipts/sql/api.sql) against real PostgreSQL: the same job the transaction writes, and caps
that fill between the read and the write refuse it with nothing written."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest

from receipts.enqueue import Admission, EnqueueRequest, enqueue, enqueue_new, parse_enqueue
from receipts.jobs import fold
from receipts.store import Store
from tests.integration.helpers import body, new_id, types


class Refused(Exception):
    pass


def fresh(org: str, **extra: Any) -> EnqueueRequest:
    request = parse_enqueue("codex", body(org=org, **extra))
    return dataclasses.replace(request, job_id=f"{uuid.uuid4()}~{org}", new_job_id=True)


async def open_jobs(store: Store, org: str) -> tuple[int, int]:
    row = await store.fetch_one("enqueue_caps", {"organization_id": org})
    assert row is not None
    return int(row[1]), int(row[2])


async def test_a_new_job_is_the_fold_of_its_receipt_at_the_clock_read(store: Store) -> None:
    org = new_id("org")
    result = await enqueue(store, fresh(org, delayMs=5_000))
    job = result.job
    assert result.outcome == "created"
    receipts = await store.read_stream(f"jobs/{job.job_id}")
    assert [r.type for r in receipts] == ["job.enqueued"]
    assert await store.get_job(job.job_id) == job == fold(receipts)
    assert job.created_at == receipts[0].recorded_at
    assert job.available_at is not None
    assert (job.available_at - job.created_at).total_seconds() == 5
    assert await open_jobs(store, org) == (1, 1)


async def test_caps_filled_after_the_read_refuse_with_nothing_written(store: Store) -> None:
    org = new_id("org")
    for _ in range(2):
        await enqueue(store, fresh(org))
    reads: list[tuple[int, int]] = []

    def refuse(queued: int, active: int) -> None:
        reads.append((queued, active))
        if len(reads) > 1:  # the first read saw room (as before a racing enqueue landed)
            raise Refused(f"{queued} queued")

    # The statement finds 2 queued of a cap of 2: it writes nothing, and the next read refuses.
    admission = Admission(org, max_queued=2, max_active=100, refuse=refuse)
    request = fresh(org)
    assert request.job_id is not None
    with pytest.raises(Refused, match="2 queued"):
        await enqueue_new(store, request, admission)
    assert reads == [(2, 2), (2, 2)]
    assert await open_jobs(store, org) == (2, 2)
    assert await types(store, request.job_id) == []
    assert await store.get_job(request.job_id) is None


async def test_a_job_under_its_caps_is_written_once(store: Store) -> None:
    org = new_id("org")
    admission = Admission(org, max_queued=1, max_active=1, refuse=lambda q, a: None)
    request = fresh(org)
    assert (await enqueue_new(store, request, admission)).created
    assert await open_jobs(store, org) == (1, 1)
    # A second one: the read passed it (a lenient check), the statement refused it each time,
    # and the locked path — which trusts the check it made — wrote it.
    other = fresh(org)
    assert (await enqueue_new(store, other, admission)).created
    assert await open_jobs(store, org) == (2, 2)
