"""Retention against live work: an objective's jobs go with it, never before it; a retry whose
copy was pruned says so; a pass that fails mid-way still reports what it removed."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from receipts import assembly, metrics, retention
from receipts import operations as ops
from receipts.enqueue import EnqueueResult, enqueue, parse_enqueue
from receipts.errors import TransientStorageError
from receipts.store import Draft, Store
from receipts.tenancy import caller_id, scoped_id
from roles.delivery.retention import RetentionLoop
from tests.integration.api_support import AS_ADMIN, api_client
from tests.integration.helpers import body, create_objective
from tests.integration.test_retention import MONTH, backdate, callback_posted, finished


async def posted(
    store: Store, job_id: str, objective_id: str, agent: str, kind: str
) -> EnqueueResult:
    """The enqueue of `job_id` naming `objective_id`, as the API posts it (a re-post is the
    same request)."""
    request = parse_enqueue(agent, body(kind=kind))
    payload = {**request.payload, "objectiveId": objective_id}
    return await enqueue(store, dataclasses.replace(request, job_id=job_id, payload=payload))


async def settled(store: Store, job_id: str, objective_id: str, agent: str, kind: str) -> str:
    job = (await posted(store, job_id, objective_id, agent, kind)).job
    worker = f"{job.job_id}:attempt:1/1"
    await ops.start_attempt(store, job.job_id, attempt=1, worker_id=worker, lease_ms=60_000)
    await ops.complete(store, job.job_id, worker_id=worker, attempt=1, result={})
    await callback_posted(store, job.job_id)
    return job.job_id


async def test_a_settled_objective_keeps_its_jobs_until_it_goes_itself(
    fresh: tuple[Store, str],
) -> None:
    """An objective that ran longer than the retention and settled just now keeps its jobs
    (its run job, its tasks') until it goes itself: with its run job pruned and the objective
    still there, a re-post of `POST /objectives` (its run job under the same id) made a second
    run job for an objective that exists and answered `created`, and the objective's tries
    named jobs that were gone."""
    from receipts.objectives import store as objectives
    from receipts.objectives.model import run_job_id, task_job_id

    store, url = fresh
    objective_id = scoped_id("org-a", "ret-half")
    run = await settled(store, run_job_id(objective_id), objective_id, "factory", "factory.run")
    await create_objective(store, objective_id)
    task = await settled(
        store, task_job_id(objective_id, "t", 1), objective_id, "codex", "factory.task.run"
    )
    async with store.transaction() as tx:
        await objectives.update(
            tx, objective_id, lambda _: [Draft("objective.settled", {"status": "completed"})]
        )
    backdate(url, [run, task])  # settled 40 days ago; the objective just now

    dry = await retention.prune(store, MONTH, dry_run=True)
    exported = [line async for line in retention.export(store, MONTH)]
    result = await retention.prune(store, MONTH)

    assert await store.get_job(run) is not None and await store.get_job(task) is not None
    assert result.removed == dry.removed == {} and exported == []
    again = await posted(store, run, objective_id, "factory", "factory.run")
    assert again.outcome == "existing" and again.job.status == "completed"


async def test_a_pass_that_fails_mid_way_reports_what_its_batches_removed(
    fresh: tuple[Store, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each batch commits on its own: a pass whose third batch fails (a lost connection, a
    deadlock) has removed the first two's rows for good. It logs `retention.pruned` and counts
    them in `receipt_retention_pruned_rows_total` before it raises (the loop logs
    `loop.failed`); they were neither logged nor counted, so the metric under-counted."""
    store, url = fresh
    jobs = [(await finished(store, "completed")).job_id for _ in range(3)]
    backdate(url, jobs)
    real, calls = retention.prune_batch, []

    async def failing(*args: Any, **kwargs: Any) -> dict[str, int]:
        calls.append(1)
        if len(calls) == 3:
            raise TransientStorageError("the connection was lost")
        return await real(*args, **kwargs)

    monkeypatch.setattr(retention, "prune_batch", failing)
    before = metrics.value("receipt_retention_pruned_rows_total", table="jobs")
    loop = RetentionLoop(store, MONTH, batch=1)
    with pytest.raises(TransientStorageError):
        await loop.run_once()
    assert [await store.get_job(j) is None for j in jobs] == [True, True, False]
    assert metrics.value("receipt_retention_pruned_rows_total", table="jobs") - before == 2


async def test_a_job_whose_retry_was_pruned_before_it_is_retried_again(
    fresh: tuple[Store, str],
) -> None:
    """A failed job stays while it owes a delivery (a receiver down longer than the retention)
    or its objective is there; the retry made of it settles and goes first. A retry of it then
    answered 409 "job … is failed; only failed or canceled jobs are retried", and no bulk retry
    takes it (it was retried): it could never run again. It is retried again, as a pruned job's
    id may be posted again, and that retry is then the one its retries return."""
    from receipts import retry as retries

    store, url = fresh
    failed = (await finished(store, "failed")).job_id
    first = await retries.retry(store, failed, organization_id=None, admin=True)
    assert first.status == retries.RETRIED and first.retry is not None
    await ops.cancel_queued(store, first.retry.job_id, reason="test")
    await callback_posted(store, first.retry.job_id)
    async with store.connection() as conn:  # its callback's receiver is down: it stays
        await conn.execute(
            "INSERT INTO callback_outbox (job_id, event) VALUES (%s, 'failed')", (failed,)
        )
    backdate(url, [failed, first.retry.job_id])
    assert (await retention.prune(store, MONTH)).jobs == 1
    assert await store.get_job(first.retry.job_id) is None

    async with api_client(url, store=store) as client:
        answer = await client.post(f"/jobs/{failed}/retry", headers=AS_ADMIN)
        again = await client.post(f"/jobs/{failed}/retry", headers=AS_ADMIN)
    assert answer.status_code == 201, answer.text
    retried = answer.json()["retry"]["jobId"]
    assert retried != first.retry.job_id and retried.startswith("retry-")
    assert answer.json()["job"]["retriedAs"] == caller_id(retried)
    assert again.status_code == 200 and again.json()["retry"]["jobId"] == retried
    assert await assembly.verify(store) == []
