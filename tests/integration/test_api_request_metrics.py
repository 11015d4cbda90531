"""The api's request metrics in-process against real PostgreSQL: each answer counted under its
route template (never the raw path, which carries ids), method and status, and timed."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from receipts import metrics
from tests.integration.api_support import AS_A, AS_ADMIN, api_client, enqueue_body
from tests.integration.helpers import new_id

JOBS = "/agents/{agentId}/jobs"
JOB = "/jobs/{jobId}"
ASSETS = "/docs/assets"


@pytest.fixture(scope="module")
async def client(db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(db_url) as client:
        yield client


def requests(route: str, method: str, status: str) -> float:
    return metrics.value("receipt_api_requests_total", route=route, method=method, status=status)


def timed(route: str, method: str) -> float:
    return metrics.value("receipt_api_request_duration_seconds_count", route=route, method=method)


async def test_requests_are_counted_by_route_template_method_and_status(
    client: httpx.AsyncClient,
) -> None:
    before = {
        "created": requests(JOBS, "POST", "202"),
        "invalid": requests(JOBS, "POST", "422"),
        "read": requests(JOB, "GET", "200"),
        "missing": requests(JOB, "GET", "404"),
        "unmatched": requests("unmatched", "GET", "404"),
        "other": requests("unmatched", "other", "404"),
        "timed": timed(JOBS, "POST"),
        "assets": requests(ASSETS, "GET", "404"),
    }
    job_id = new_id()
    created = await client.post("/agents/codex/jobs", json=enqueue_body(jobId=job_id), headers=AS_A)
    assert created.status_code == 202, created.text
    invalid = await client.post("/agents/codex/jobs", json={"payload": 1}, headers=AS_A)
    assert invalid.status_code == 422
    shown = await client.get(f"/jobs/{job_id}", headers=AS_A)
    assert shown.status_code == 200
    assert (await client.get(f"/jobs/{new_id()}", headers=AS_A)).status_code == 404
    assert (await client.get(f"/no/such/{job_id}")).status_code == 404
    assert (await client.request("BREW", f"/pot/{job_id}")).status_code == 404
    assert (await client.get(f"/docs/assets/{job_id}.css")).status_code == 404

    assert requests(JOBS, "POST", "202") - before["created"] == 1
    assert requests(JOBS, "POST", "422") - before["invalid"] == 1
    assert requests(JOB, "GET", "200") - before["read"] == 1
    assert requests(JOB, "GET", "404") - before["missing"] == 1
    assert requests("unmatched", "GET", "404") - before["unmatched"] == 1
    assert requests("unmatched", "other", "404") - before["other"] == 1
    assert timed(JOBS, "POST") - before["timed"] == 2
    assert requests(ASSETS, "GET", "404") - before["assets"] == 1  # a mount: its prefix
    # No label value anywhere carries an id the caller chose.
    exported = (await client.get("/metrics", headers=AS_ADMIN)).text
    families = [line for line in exported.splitlines() if line.startswith("receipt_api_request")]
    assert families and not [line for line in families if job_id in line], families
