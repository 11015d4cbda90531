"""The group commit of new jobs (receipts/enqueue_batch.py, `enqueue_caps_many` and
`enqueue_new_many` in receipts/sql/api.sql) against real PostgreSQL: a batch writes what each
enqueue alone would, refuses past an organization's caps as one after the other would, and
answers each caller as alone when its statement fails."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import re
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from receipts import assembly, metrics, notices
from receipts.enqueue import Admission, enqueue_new, enqueued_data, parse_enqueue
from receipts.enqueue_batch import EnqueueBatcher, _many_params, enqueue_new_many
from receipts.errors import ConflictError, TransientStorageError
from receipts.job_append import plan
from receipts.jobs import fold
from receipts.sql import query
from receipts.store import Draft, Store
from tests.integration.api_support import AS_A, api_client, enqueue_body
from tests.integration.helpers import body, new_id, types
from tests.integration.test_enqueue_new import fresh, open_jobs


class Refused(Exception):
    pass


def capped(org: str, max_queued: int = 100, max_active: int = 100) -> Admission:
    """Caps that refuse as the API's do: no room for one more."""

    def refuse(queued: int, active: int) -> None:
        if queued >= max_queued or active >= max_active:
            raise Refused(f"{queued} queued, {active} active")

    return Admission(org, max_queued, max_active, refuse)


def lenient(org: str, max_queued: int) -> Admission:
    """Caps whose read never refuses: only the statement's own check does."""
    return Admission(org, max_queued, 100, lambda queued, active: None)


async def test_a_batch_writes_each_job_as_its_enqueue_alone_would(
    store: Store, db_url: str
) -> None:
    org_a, org_b = new_id("org"), new_id("org")
    requests = [fresh(org_a), fresh(org_b, delayMs=5_000), fresh(org_a), fresh(org_b)]
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listening:
        await listening.execute(f"LISTEN {notices.DISPATCH}")
        outcomes = await enqueue_new_many(
            store, [(r, capped(r.organization_id or "")) for r in requests]
        )
        notes = [n.payload async for n in _notes(listening, len(requests))]
    jobs = []
    for request, outcome in zip(requests, outcomes, strict=True):
        assert not isinstance(outcome, Exception)
        assert outcome.outcome == "created"
        job = outcome.job
        receipts = await store.read_stream(f"jobs/{request.job_id}")
        assert [r.type for r in receipts] == ["job.enqueued"]
        assert await store.get_job(job.job_id) == job == fold(receipts)
        assert job.created_at == receipts[0].recorded_at
        jobs.append(job)
    # One clock read for the batch; a delay counts from it.
    assert len({j.created_at for j in jobs}) == 1
    delayed = jobs[1]
    assert delayed.available_at is not None
    assert (delayed.available_at - delayed.created_at).total_seconds() == 5
    assert await open_jobs(store, org_a) == (2, 2)
    assert await open_jobs(store, org_b) == (2, 2)
    # Each job announced on the dispatch channel, as alone.
    assert sorted(notes) == sorted(
        f'{{"stream":"jobs/{r.job_id}","seq":1,"types":["job.enqueued"]}}' for r in requests
    )


async def test_a_batch_writes_the_rows_enqueue_new_writes(store: Store, db_url: str) -> None:
    org = new_id("org")
    alone, batched = fresh(org, delayMs=1_000), fresh(org, delayMs=1_000)
    assert alone.job_id is not None and batched.job_id is not None
    await enqueue_new(store, alone, capped(org))
    await enqueue_new_many(store, [(batched, capped(org)), (fresh(org), capped(org))])
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        rows = []
        for job_id in (alone.job_id, batched.job_id):
            cur = await conn.execute(
                "SELECT row_to_json(j)::text, (SELECT row_to_json(r)::text FROM receipts r"
                " WHERE r.stream = 'jobs/' || j.job_id) FROM jobs j WHERE j.job_id = %s",
                [job_id],
            )
            [(job_row, receipt_row)] = await cur.fetchall()
            rows.append(_normalised(f"{job_row} {receipt_row}", job_id))
    assert rows[0] == rows[1]


def _normalised(text: str, job_id: str) -> str:
    """`text` without what differs between two jobs enqueued alike: ids, times, positions."""
    text = text.replace(job_id, "<job>")
    text = re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+(\+00:00|Z)?", "<time>", text)
    return re.sub(r'"position":\d+', '"position":<n>', text)


async def _notes(conn: psycopg.AsyncConnection[Any], count: int) -> Any:
    async with asyncio.timeout(5):
        async for note in conn.notifies():
            yield note
            count -= 1
            if count == 0:
                return


async def test_caps_refuse_a_batch_s_jobs_past_the_room_left_as_one_after_another(
    store: Store,
) -> None:
    org, neighbour = new_id("org"), new_id("org")
    await enqueue_new_many(store, [(fresh(org), capped(org))])
    requests = [fresh(org) for _ in range(4)]
    other = fresh(neighbour)
    outcomes = await enqueue_new_many(
        store, [*((r, capped(org, max_queued=3)) for r in requests), (other, capped(neighbour))]
    )
    created = [o for o in outcomes if not isinstance(o, Exception)]
    refused = [o for o in outcomes if isinstance(o, Exception)]
    # One was queued: two fit a cap of three, the two after them are refused, with the counts
    # the caps would have read one after another; the other organization is not held back.
    assert [str(e) for e in refused] == ["3 queued, 3 active", "3 queued, 3 active"]
    assert [o.job.job_id for o in created] == [
        requests[0].job_id,
        requests[1].job_id,
        other.job_id,
    ]
    assert await open_jobs(store, org) == (3, 3)
    for request in requests[2:]:
        assert request.job_id is not None
        assert await types(store, request.job_id) == []
        assert await store.get_job(request.job_id) is None


async def test_caps_that_moved_after_the_read_send_their_organization_s_jobs_alone(
    store: Store,
) -> None:
    org, neighbour = new_id("org"), new_id("org")
    for _ in range(2):
        await enqueue_new_many(store, [(fresh(org), capped(org))])
    alone = metrics.value("receipt_enqueue_batch_alone_total", reason="caps")
    # The read passes both (a lenient check, as when a racing enqueue lands after it); the
    # statement finds no room for either, writes the neighbour's job only, and each of the
    # organization's is enqueued alone — where the locked path, trusting its check, writes it.
    requests = [fresh(org), fresh(org)]
    other = fresh(neighbour)
    outcomes = await enqueue_new_many(
        store, [*((r, lenient(org, 2)) for r in requests), (other, capped(neighbour))]
    )
    assert [o.outcome for o in outcomes if not isinstance(o, Exception)] == ["created"] * 3
    assert metrics.value("receipt_enqueue_batch_alone_total", reason="caps") == alone + 2
    assert await open_jobs(store, org) == (4, 4)
    assert await open_jobs(store, neighbour) == (1, 1)


async def _on_one_slot(db_url: str, count: int) -> list[psycopg.AsyncConnection[Any]]:
    """`count` connections whose backends add to one counter slot (pg_backend_pid() % 16,
    migration 0009), as the backends of several api processes may."""
    found: list[psycopg.AsyncConnection[Any]] = []
    for _ in range(64 * count):
        conn = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
        if not found or conn.info.backend_pid % 16 == found[0].info.backend_pid % 16:
            found.append(conn)
            if len(found) == count:
                return found
        else:
            await conn.close()
    raise AssertionError("no backends on one slot")


async def test_batches_of_api_processes_on_one_counter_slot_never_deadlock(
    db_url: str,
) -> None:
    # Each job's insert locks its organization's counter row of its backend's slot until the
    # statement commits; a batch naming several organizations locks several. Batches of api
    # processes whose backends share a slot would deadlock on them locked in arrival order (71
    # of 600 such statements did, a second each); `_many_params` orders them by organization.
    conns = await _on_one_slot(db_url, 4)
    organizations = [new_id("org") for _ in range(8)]
    draw = random.Random(7)
    now = datetime.now(UTC)

    def batch() -> dict[str, Any]:
        appends = []
        for org in draw.choices(organizations, k=draw.randint(2, 16)):
            request = fresh(org)
            assert request.job_id is not None
            draft = Draft("job.enqueued", enqueued_data(request, request.job_id, now))
            append = plan(request.job_id, None, [draft], now, owe_callbacks=False)
            appends.append((append, capped(org, 10**6, 10**6)))
        return _many_params(appends, now)

    async def run(conn: psycopg.AsyncConnection[Any], batches: list[dict[str, Any]]) -> int:
        deadlocks = 0
        for params in batches:
            try:
                await conn.execute(query("enqueue_new_many"), params)
            except psycopg.errors.DeadlockDetected:
                deadlocks += 1
        return deadlocks

    try:
        work = [[batch() for _ in range(100)] for _ in conns]
        deadlocks = await asyncio.gather(*(run(c, w) for c, w in zip(conns, work, strict=True)))
    finally:
        for conn in conns:
            await conn.close()
    assert deadlocks == [0] * len(conns)


async def test_a_batch_that_fails_transiently_answers_each_caller_with_it(
    store: Store, db_url: str
) -> None:
    # A lost connection may have come after the commit: the jobs were written, and enqueueing
    # them again would answer 409 for a job the caller has. Each is answered as alone (503).
    org = new_id("org")
    requests = [fresh(org) for _ in range(3)]
    async with await psycopg.AsyncConnection.connect(db_url) as holder:
        # The counter row the batch's inserts update is held, and the batch's statement runs
        # out of time waiting for it: a transient failure (57014, the api's statement_timeout).
        await holder.execute(
            "INSERT INTO org_open_jobs (organization_id, slot) "
            "SELECT %s, s FROM generate_series(0, 15) AS s",
            [org],
        )
        limited = await assembly.open_store(
            db_url, min_size=1, max_size=1, session={"statement_timeout": "300"}
        )
        try:
            alone = metrics.value("receipt_enqueue_batch_alone_total", reason="error")
            outcomes = await enqueue_new_many(limited, [(r, capped(org)) for r in requests])
        finally:
            await limited.close()
        await holder.rollback()
    assert [type(o) for o in outcomes] == [TransientStorageError] * 3
    assert metrics.value("receipt_enqueue_batch_alone_total", reason="error") == alone
    for request in requests:
        assert request.job_id is not None
        assert await store.get_job(request.job_id) is None


async def test_concurrent_enqueues_are_written_together_and_a_lone_one_alone(
    store: Store,
) -> None:
    batcher = EnqueueBatcher(store)
    # Each fallback's series exists from the start, at 0 if nothing fell back (an alert's
    # increase() sees the first; deploy/prometheus/receipt-rules.yaml).
    for reason in ("caps", "policy", "error"):
        labels = {"reason": reason}
        assert (
            metrics.REGISTRY.get_sample_value("receipt_enqueue_batch_alone_total", labels)
            is not None
        )
    org = new_id("org")
    writes = metrics.value("receipt_enqueue_batch_jobs_count")
    jobs = metrics.value("receipt_enqueue_batch_jobs_sum")
    requests = [fresh(org) for _ in range(16)]
    results = await asyncio.gather(*(batcher.enqueue(r, capped(org)) for r in requests))
    assert [r.job.job_id for r in results] == [r.job_id for r in requests]
    assert all(r.created for r in results)
    # The first was written alone, in its caller's task; the 15 that came meanwhile, together.
    assert metrics.value("receipt_enqueue_batch_jobs_count") == writes + 2
    assert metrics.value("receipt_enqueue_batch_jobs_sum") == jobs + 16
    assert await open_jobs(store, org) == (16, 16)
    # With nothing in flight, an enqueue is written alone.
    assert (await batcher.enqueue(fresh(org), capped(org))).created
    assert metrics.value("receipt_enqueue_batch_jobs_count") == writes + 3


async def test_a_job_that_is_not_new_is_enqueued_as_ever(store: Store) -> None:
    batcher = EnqueueBatcher(store)
    org = new_id("org")
    named = parse_enqueue("codex", _named(org, "named-1"))
    first = await batcher.enqueue(named, capped(org))
    again = await batcher.enqueue(named, capped(org))
    assert (first.outcome, again.outcome) == ("created", "existing")
    assert again.job.job_id == first.job.job_id


def _named(org: str, job_id: str) -> dict[str, Any]:
    return {**body(org=org), "jobId": job_id}


async def test_a_failed_batch_answers_each_caller_as_if_alone(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    batcher = EnqueueBatcher(store)
    org = new_id("org")
    first, second = fresh(org), fresh(org)
    twin = dataclasses.replace(fresh(org), job_id=second.job_id)  # the same id: one must fail
    alone = metrics.value("receipt_enqueue_batch_alone_total", reason="error")
    with caplog.at_level(logging.WARNING, logger="receipts.enqueue"):
        outcomes = await asyncio.gather(
            batcher.enqueue(first, capped(org)),
            batcher.enqueue(second, capped(org)),
            batcher.enqueue(twin, capped(org)),
            return_exceptions=True,
        )
    # `first` went alone; the batch of the other two failed on the duplicate id, wrote nothing,
    # and each was then enqueued alone: one written, the other refused as it would have been.
    assert not isinstance(outcomes[0], BaseException) and outcomes[0].created
    written = [o for o in outcomes[1:] if not isinstance(o, BaseException)]
    failed = [o for o in outcomes[1:] if isinstance(o, BaseException)]
    assert len(written) == 1 and written[0].job.job_id == second.job_id
    assert len(failed) == 1 and isinstance(failed[0], ConflictError)
    assert metrics.value("receipt_enqueue_batch_alone_total", reason="error") == alone + 2
    assert [r.event for r in caplog.records if hasattr(r, "event")] == ["enqueue.batch_failed"]
    assert await open_jobs(store, org) == (2, 2)


async def test_a_caller_gone_before_its_batch_is_written_is_not_written(store: Store) -> None:
    batcher = EnqueueBatcher(store)
    org = new_id("org")
    first, gone, kept = fresh(org), fresh(org), fresh(org)
    leading = asyncio.create_task(batcher.enqueue(first, capped(org)))
    await asyncio.sleep(0)  # the first is being written alone; the others wait
    going = asyncio.create_task(batcher.enqueue(gone, capped(org)))
    staying = asyncio.create_task(batcher.enqueue(kept, capped(org)))
    await asyncio.sleep(0)
    going.cancel()
    assert (await leading).created and (await staying).created
    with pytest.raises(asyncio.CancelledError):
        await going
    assert gone.job_id is not None
    assert await store.get_job(gone.job_id) is None
    assert await open_jobs(store, org) == (2, 2)


async def test_concurrent_posts_are_written_together_each_answered_with_its_job(
    db_url: str,
) -> None:
    writes = metrics.value("receipt_enqueue_batch_jobs_count")
    async with api_client(db_url) as client:
        posts = await asyncio.gather(
            *(
                client.post("/agents/codex/jobs", json=enqueue_body(), headers=AS_A)
                for _ in range(16)
            )
        )
        assert [p.status_code for p in posts] == [202] * 16
        ids = [p.json()["job"]["jobId"] for p in posts]
        assert len(set(ids)) == 16
        for job_id in ids:
            read = await client.get(f"/jobs/{job_id}", headers=AS_A)
            assert read.status_code == 200 and read.json()["status"] == "queued"
    assert writes < metrics.value("receipt_enqueue_batch_jobs_count") < writes + 16


async def test_concurrent_posts_to_one_api_process_hold_an_organization_s_cap_exactly(
    db_url: str,
) -> None:
    org = new_id("org")
    as_org = {"Authorization": f"Bearer token-{org}"}
    async with api_client(db_url, tokens=f"token-{org} {org}", org_max_queued=5) as client:
        posts = await asyncio.gather(
            *(
                client.post("/agents/codex/jobs", json=enqueue_body(org=org), headers=as_org)
                for _ in range(16)
            )
        )
    statuses = sorted(p.status_code for p in posts)
    assert statuses == [202] * 5 + [429] * 11
    refused = next(p for p in posts if p.status_code == 429)
    assert "RECEIPT_ORG_MAX_QUEUED" in refused.json()["error"]["message"]
