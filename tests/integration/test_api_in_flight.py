"""One organization's reads cannot take the api's database pool from another's requests.

Measured on a real `receipt api` (20 connections) over a million jobs of one organization: 200
concurrent `GET /jobs?agentId=<none of them>` of that organization took another's
`GET /jobs/{id}` from 7 to 9 247 ms and its enqueue from 7 to 8 532 ms (the flooder's own
requests 503 on the pool). Past RECEIPT_ORG_REQUESTS_IN_FLIGHT (8) the organization's next
request is 429: 33/115 ms (p50/p99) and 63/203 ms beside the same flood ignoring Retry-After."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import REGISTRY

from receipts import assembly, reads
from tests.integration.api_support import AS_A, AS_ADMIN, AS_B, api_client, enqueue_body

HELD = 6


def refused_in_flight() -> float:
    return REGISTRY.get_sample_value("receipt_api_limited_total", {"limit": "in_flight"}) or 0.0


async def test_an_organizations_slow_reads_leave_another_organization_the_pool(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each of org-a's job lists holds a pooled connection until released (a slow statement
    over a large history): six of them at once held the api's pool of four, and org-b's read of
    its own job and its enqueue waited for the pool. With at most two in flight per
    organization, org-a's others are 429 at once and org-b is served."""
    released = asyncio.Event()
    real_page = reads.jobs_page

    async def slow_page(store: Any, *args: Any, **kwargs: Any) -> Any:
        async with store.session():
            await released.wait()
        return await real_page(store, *args, **kwargs)

    monkeypatch.setattr(reads, "jobs_page", slow_page)
    store = await assembly.open_store(db_url, min_size=1, max_size=4)
    try:
        async with api_client(db_url, store=store, org_requests_in_flight=2) as client:
            job_id = (
                await client.post("/agents/codex/jobs", json=enqueue_body("org-b"), headers=AS_B)
            ).json()["job"]["jobId"]
            before = refused_in_flight()
            lists = [
                asyncio.create_task(client.get("/jobs?limit=5", headers=AS_A)) for _ in range(HELD)
            ]
            await asyncio.sleep(0.3)
            own = await asyncio.wait_for(client.get(f"/jobs/{job_id}", headers=AS_B), 3)
            assert own.status_code == 200, own.text
            posted = await asyncio.wait_for(
                client.post("/agents/codex/jobs", json=enqueue_body("org-b"), headers=AS_B), 3
            )
            assert posted.status_code == 202, posted.text
            # An admin's requests are the operator's own: not counted.
            admin = await asyncio.wait_for(client.get(f"/jobs/{job_id}", headers=AS_ADMIN), 3)
            assert admin.status_code == 200, admin.text
            released.set()
            answers = await asyncio.gather(*lists)
            refused = [a for a in answers if a.status_code == 429]
            assert sorted(a.status_code for a in answers) == [200] * 2 + [429] * (HELD - 2)
            assert refused[0].headers["Retry-After"] == "1"
            message = refused[0].json()["error"]["message"]
            assert "RECEIPT_ORG_REQUESTS_IN_FLIGHT" in message
            assert refused_in_flight() - before == HELD - 2
            # Every slot came back: org-a is served again, as many at once as its cap.
            again = await asyncio.gather(*(client.get("/jobs", headers=AS_A) for _ in range(2)))
            assert [a.status_code for a in again] == [200, 200]
    finally:
        await store.close()
