"""Live event streams from a real `receipt api` process, fed by LISTEN/NOTIFY.

Every receipt here is appended by the test process through its own `Store`: another process
than the API server, which learns of them only through NOTIFY.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from receipts import operations as ops
from receipts.store import Store
from tests.integration.api_support import (
    AS_A,
    AS_B,
    RunningApi,
    enqueue_body,
    events,
    rid,
    running_api,
)
from tests.integration.helpers import types

LEASE_MS = 60_000
STREAM = {**AS_A, "Accept": "text/event-stream"}


@pytest.fixture(scope="module")
def api(db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    with running_api(db_url, Path(tmp_path_factory.mktemp("api"))) as api:
        yield api


@pytest.fixture
async def client(api: RunningApi) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api.url, timeout=20) as client:
        yield client


async def enqueue(client: httpx.AsyncClient, **body: Any) -> str:
    response = await client.post("/agents/codex/jobs", json=enqueue_body(**body), headers=AS_A)
    assert response.status_code == 202, response.text
    job_id: str = response.json()["job"]["jobId"]
    return job_id


async def collect(
    client: httpx.AsyncClient,
    job_id: str,
    headers: dict[str, str] = STREAM,
    params: dict[str, Any] | None = None,
    stop_after: int | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Read a job's stream until `end` (returning its data) or `stop_after` receipts."""
    received: list[dict[str, Any]] = []
    async with client.stream(
        "GET", f"/jobs/{job_id}/events", headers=headers, params=params
    ) as response:
        async for event in events(response):
            if event.name == "end":
                return received, json.loads(event.data)
            receipt = json.loads(event.data)
            assert event.id == str(receipt["seq"])
            received.append(receipt)
            if stop_after is not None and len(received) >= stop_after:
                return received, None
    raise AssertionError(f"the stream closed without an end event after {received}")


async def run_job(store: Store, job_id: str, progress: int) -> None:
    job_id = rid(job_id)
    worker = f"{job_id}:attempt:1/1"
    assert (await ops.lease(store, job_id, attempt=1, worker_id=worker, lease_ms=LEASE_MS)).ok
    assert (await ops.heartbeat(store, job_id, worker_id=worker, attempt=1, lease_ms=LEASE_MS)).ok
    for n in range(progress):
        assert (await ops.progress(store, job_id, worker_id=worker, attempt=1, data={"n": n})).ok
        await asyncio.sleep(0)
    assert (await ops.complete(store, job_id, worker_id=worker, attempt=1, result="ok")).ok


async def test_a_subscriber_sees_every_receipt_in_order_then_the_end(
    client: httpx.AsyncClient, store: Store
) -> None:
    job_id = await enqueue(client)
    received: list[dict[str, Any]] = []
    async with client.stream("GET", f"/jobs/{job_id}/events", headers=STREAM) as response:
        stream = events(response)
        first = await anext(stream)
        received.append(json.loads(first.data))
        # The subscriber is live now; everything else arrives through NOTIFY.
        appender = asyncio.create_task(run_job(store, job_id, progress=25))
        end = None
        async for event in stream:
            if event.name == "end":
                end = json.loads(event.data)
                break
            received.append(json.loads(event.data))
        await appender
    assert end == {"jobId": job_id, "status": "completed"}
    stored = await store.read_stream(f"jobs/{rid(job_id)}")
    assert [r["seq"] for r in received] == [r.seq for r in stored] == list(range(1, 30))
    assert [r["type"] for r in received] == [r.type for r in stored]
    assert received[-1]["type"] == "job.completed"
    assert [r["data"]["data"]["n"] for r in received if r["type"] == "job.progress"] == list(
        range(25)
    )


async def test_concurrent_subscribers_each_see_the_same_receipts(
    client: httpx.AsyncClient, store: Store
) -> None:
    job_id = await enqueue(client)
    readers = [asyncio.create_task(collect(client, job_id)) for _ in range(4)]
    await asyncio.sleep(0.2)
    await run_job(store, job_id, progress=10)
    results = await asyncio.gather(*readers)
    expected = [r.seq for r in await store.read_stream(f"jobs/{rid(job_id)}")]
    for received, end in results:
        assert [r["seq"] for r in received] == expected
        assert end == {"jobId": job_id, "status": "completed"}


async def test_a_reconnect_with_last_event_id_misses_none_and_repeats_none(
    client: httpx.AsyncClient, store: Store
) -> None:
    job_id = await enqueue(client)
    worker = f"{job_id}:attempt:1/1"
    assert (await ops.lease(store, rid(job_id), attempt=1, worker_id=worker, lease_ms=LEASE_MS)).ok
    first, _ = await collect(client, job_id, stop_after=2)
    assert [r["seq"] for r in first] == [1, 2]
    # Appended while nobody is connected.
    for n in range(5):
        assert (await ops.progress(store, rid(job_id), worker_id=worker, attempt=1, data=n)).ok
    resumed = asyncio.create_task(
        collect(client, job_id, headers={**STREAM, "Last-Event-ID": str(first[-1]["seq"])})
    )
    await asyncio.sleep(0.2)
    for n in range(5, 8):
        assert (await ops.progress(store, rid(job_id), worker_id=worker, attempt=1, data=n)).ok
    assert (await ops.complete(store, rid(job_id), worker_id=worker, attempt=1)).ok
    second, end = await resumed
    assert end == {"jobId": job_id, "status": "completed"}
    seqs = [r["seq"] for r in first + second]
    assert seqs == list(range(1, len(await types(store, rid(job_id))) + 1))
    assert [r["data"]["data"] for r in second if r["type"] == "job.progress"] == list(range(8))


async def test_after_resumes_a_stream_and_last_event_id_wins_over_it(
    client: httpx.AsyncClient, store: Store
) -> None:
    job_id = await enqueue(client)
    await run_job(store, job_id, progress=3)
    received, end = await collect(client, job_id, params={"after": 4})
    assert [r["seq"] for r in received] == [5, 6, 7]
    assert end == {"jobId": job_id, "status": "completed"}
    received, _ = await collect(
        client, job_id, params={"after": 1}, headers={**STREAM, "Last-Event-ID": "6"}
    )
    assert [r["seq"] for r in received] == [7]


async def test_a_stream_resumed_past_the_terminal_receipt_ends_at_once(
    client: httpx.AsyncClient, store: Store
) -> None:
    job_id = await enqueue(client)
    await run_job(store, job_id, progress=0)
    last = len(await types(store, rid(job_id)))
    received, end = await collect(client, job_id, headers={**STREAM, "Last-Event-ID": str(last)})
    assert received == []
    assert end == {"jobId": job_id, "status": "completed"}


async def test_a_lease_expiry_ends_the_stream_only_when_it_leaves_the_job_failed(
    client: httpx.AsyncClient, store: Store
) -> None:
    job_id = await enqueue(client, maxAttempts=2)
    reader = asyncio.create_task(collect(client, job_id))
    await asyncio.sleep(0.2)
    for attempt in (1, 2):
        worker = f"{job_id}:attempt:{attempt}/1"
        assert (
            await ops.lease(store, rid(job_id), attempt=attempt, worker_id=worker, lease_ms=1)
        ).ok
        await asyncio.sleep(0.01)
        expired = await ops.expire_lease(store, rid(job_id))
        assert expired.ok and expired.job is not None
        assert expired.job.status == ("queued" if attempt == 1 else "failed")
        if attempt == 1:
            await asyncio.sleep(0.1)
            assert not reader.done()
    received, end = await asyncio.wait_for(reader, 10)
    assert [r["type"] for r in received] == [
        "job.enqueued",
        "job.leased",
        "job.lease_expired",
        "job.leased",
        "job.lease_expired",
    ]
    assert end == {"jobId": job_id, "status": "failed"}


async def test_a_retryable_failure_continues_and_an_abort_of_a_queued_job_ends(
    client: httpx.AsyncClient, store: Store
) -> None:
    job_id = await enqueue(client, maxAttempts=2)
    reader = asyncio.create_task(collect(client, job_id))
    await asyncio.sleep(0.2)
    worker = f"{job_id}:attempt:1/1"
    assert (await ops.lease(store, rid(job_id), attempt=1, worker_id=worker, lease_ms=LEASE_MS)).ok
    failed = await ops.fail(
        store, rid(job_id), worker_id=worker, attempt=1, error="x", retryable=True
    )
    assert failed.ok and failed.job is not None and failed.job.status == "queued"
    response = await client.post(
        f"/jobs/{job_id}/commands", json={"type": "abort", "reason": "stop"}, headers=AS_A
    )
    assert response.status_code == 202
    received, end = await asyncio.wait_for(reader, 10)
    assert [r["type"] for r in received] == [
        "job.enqueued",
        "job.leased",
        "job.failed",
        "queue.command",
        "job.canceled",
    ]
    assert end == {"jobId": job_id, "status": "canceled"}


async def test_another_organization_cannot_stream_a_job(client: httpx.AsyncClient) -> None:
    job_id = await enqueue(client)
    response = await client.get(
        f"/jobs/{job_id}/events", headers={**AS_B, "Accept": "text/event-stream"}
    )
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


async def test_a_stream_shows_an_organization_no_global_position(
    client: httpx.AsyncClient,
) -> None:
    # As a JSON page (test_api_auth.py): the gap between the positions of two of org-a's
    # receipts would count the receipts org-b wrote in between.
    async def position() -> int:
        received, _ = await collect(client, await enqueue(client), stop_after=1)
        found: int = received[0]["position"]
        return found

    first, quiet = await position(), await position()
    for _ in range(3):
        theirs = enqueue_body(org="org-b")
        assert (await client.post("/agents/codex/jobs", json=theirs, headers=AS_B)).is_success
    busy = await position()
    assert busy - quiet == quiet - first


async def test_an_invalid_last_event_id_is_422(client: httpx.AsyncClient) -> None:
    job_id = await enqueue(client)
    response = await client.get(
        f"/jobs/{job_id}/events", headers={**STREAM, "Last-Event-ID": "seven"}
    )
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "Last-Event-ID"


async def test_an_idle_stream_sends_keepalive_comments(
    db_url: str, tmp_path: Path, store: Store
) -> None:
    # The default is 15 s (SSE_KEEPALIVE_S); a short period keeps the test short.
    with running_api(db_url, tmp_path, RECEIPT_SSE_KEEPALIVE_MS="300") as api:
        async with httpx.AsyncClient(base_url=api.url, timeout=20) as client:
            job_id = await enqueue(client)
            lines: list[str] = []
            started = asyncio.get_running_loop().time()
            async with client.stream("GET", f"/jobs/{job_id}/events", headers=STREAM) as response:
                async for line in response.aiter_lines():
                    lines.append(line)
                    if lines.count(": keepalive") == 3:
                        break
            elapsed = asyncio.get_running_loop().time() - started
    # The backlog (retry hint, job.enqueued) first, then only comments while nothing happens.
    assert lines[0].startswith("retry: ")
    assert any(line.startswith("id: 1") for line in lines)
    tail = lines[lines.index(": keepalive") :]
    assert [line for line in tail if line] == [": keepalive"] * 3
    assert 0.8 <= elapsed < 10
    assert await types(store, rid(job_id)) == ["job.enqueued"]


def test_the_keepalive_period_defaults_to_fifteen_seconds() -> None:
    from roles.api.settings import SSE_KEEPALIVE_S, ApiSettings

    assert SSE_KEEPALIVE_S == 15.0
    assert ApiSettings().sse_keepalive_ms == 15_000
