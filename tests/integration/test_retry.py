"""Retry of settled jobs over the API: a new job linked both ways, idempotent, bounded, tenant-safe."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from receipts import operations
from receipts.agent_jobs.model import TURN_AGENT_ID
from receipts.enqueue import EnqueueRequest, enqueue
from receipts.kinds import TURN_KIND
from receipts.store import Store
from tests.integration.api_support import AS_A, AS_ADMIN, AS_B, api_client, enqueue_body, rid
from tests.integration.helpers import new_id, types


async def _failed_job(client, store: Store, agent: str = "codex", error: str = "boom") -> str:  # type: ignore[no-untyped-def]
    job_id = new_id()
    posted = await client.post(
        f"/agents/{agent}/jobs",
        json=enqueue_body(jobId=job_id, sessionKey="s-1", lane="follow_up", maxAttempts=3),
        headers=AS_A,
    )
    assert posted.status_code == 202, posted.text
    outcome = await operations.fail_undeliverable(store, rid(job_id), error=error)
    assert outcome.ok
    return job_id


async def test_retry_creates_a_linked_job_with_the_same_payload_and_route(
    db_url: str, store: Store
) -> None:
    async with api_client(db_url, store=store) as client:
        old_id = await _failed_job(client, store)
        answer = await client.post(f"/jobs/{old_id}/retry", headers=AS_A)
        assert answer.status_code == 201, answer.text
        body = answer.json()
        assert body["outcome"] == "retried"
        new = body["retry"]
        old = (await client.get(f"/jobs/{old_id}", headers=AS_A)).json()
    assert new["retryOf"] == old_id and old["retriedAs"] == new["jobId"]
    assert old["status"] == "failed"  # a terminal job never moves
    assert new["status"] == "queued"
    for field in ("agentId", "lane", "kind", "payload", "sessionKey", "maxAttempts", "route"):
        assert new[field] == old[field], field
    assert (await types(store, rid(old_id)))[-1] == "job.retried"


async def test_retrying_twice_returns_the_first_retry_and_creates_nothing(
    db_url: str, store: Store
) -> None:
    async with api_client(db_url, store=store) as client:
        old_id = await _failed_job(client, store)
        first, second = await asyncio.gather(
            client.post(f"/jobs/{old_id}/retry", headers=AS_A),
            client.post(f"/jobs/{old_id}/retry", headers=AS_A),
        )
    answers = sorted([first, second], key=lambda r: r.status_code)
    assert [a.status_code for a in answers] == [200, 201]
    assert answers[0].json()["outcome"] == "already_retried"
    assert answers[0].json()["retry"]["jobId"] == answers[1].json()["retry"]["jobId"]
    assert (await types(store, rid(old_id))).count("job.retried") == 1


async def test_retry_refuses_active_and_completed_jobs_and_other_organizations(
    db_url: str, store: Store
) -> None:
    async with api_client(db_url, store=store) as client:
        queued_id = new_id()
        await client.post("/agents/codex/jobs", json=enqueue_body(jobId=queued_id), headers=AS_A)
        refused = await client.post(f"/jobs/{queued_id}/retry", headers=AS_A)
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "not_retryable"
        assert "queued" in refused.json()["error"]["message"]
        failed_id = await _failed_job(client, store)
        foreign = await client.post(f"/jobs/{failed_id}/retry", headers=AS_B)
        unknown = await client.post(f"/jobs/{new_id()}/retry", headers=AS_B)
        assert foreign.status_code == unknown.status_code == 404
        assert foreign.json()["error"]["code"] == unknown.json()["error"]["code"]
    assert "job.retried" not in await types(store, rid(failed_id))


async def test_an_agent_jobs_turn_is_not_retried_one_by_one(db_url: str, store: Store) -> None:
    """Run again outside its agent job, a turn would repeat its command while its end is
    refused, and no retention path would take it: only its agent job retries it."""
    turn_id = f"{new_id('agent-job')}:attempt:1"
    turn = EnqueueRequest(
        agent_id=TURN_AGENT_ID,
        payload={
            "kind": TURN_KIND,
            "authContext": {"userId": "u-1", "organizationId": "org-a"},
            "agentJob": {"agentJobId": turn_id.split(":")[0], "attempt": 1, "turn": 1},
        },
        kind=TURN_KIND,
        organization_id="org-a",
        job_id=rid(turn_id),
        max_attempts=1,
    )
    await enqueue(store, turn)
    error = f"lost {turn_id}"
    assert (await operations.fail_undeliverable(store, rid(turn_id), error=error)).ok
    async with api_client(db_url, store=store) as client:
        refused = await client.post(f"/jobs/{turn_id}/retry", headers=AS_A)
        bulk = await client.post(
            "/jobs/retry", json={"status": "failed", "error": error}, headers=AS_A
        )
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "not_retryable"
    assert "a turn of an agent job" in refused.json()["error"]["message"]
    assert bulk.status_code == 200, bulk.text
    assert bulk.json()["count"] == 0
    assert "job.retried" not in await types(store, rid(turn_id))


async def test_bulk_retry_is_bounded_filtered_and_idempotent(db_url: str, store: Store) -> None:
    agent = f"agent-{new_id()}"
    async with api_client(db_url, store=store) as client:
        ids = [await _failed_job(client, store, agent=agent, error="disk full") for _ in range(3)]
        other = await _failed_job(client, store, agent=agent, error="other error")
        bounded = await client.post(
            "/jobs/retry",
            json={"agentId": agent, "error": "disk full", "limit": 2},
            headers=AS_A,
        )
        assert bounded.status_code == 200, bounded.text
        assert bounded.json()["count"] == 2
        rest = await client.post(
            "/jobs/retry", json={"agentId": agent, "error": "disk full"}, headers=AS_A
        )
        again = await client.post(
            "/jobs/retry", json={"agentId": agent, "error": "disk full"}, headers=AS_A
        )
        foreign = await client.post("/jobs/retry", json={"agentId": agent}, headers=AS_B)
        bad = await client.post("/jobs/retry", json={"limit": 501}, headers=AS_ADMIN)
        unknown_field = await client.post("/jobs/retry", json={"agent": agent}, headers=AS_A)
    assert rest.json()["count"] == 1
    assert again.json()["count"] == 0
    assert foreign.json()["count"] == 0
    retried = {r["jobId"] for r in bounded.json()["retried"] + rest.json()["retried"]}
    assert retried == set(ids)
    assert "job.retried" not in await types(store, rid(other))
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "limit"
    assert unknown_field.status_code == 422 and unknown_field.json()["error"]["field"] == "agent"


async def test_a_retry_is_held_to_the_allow_list_and_timeout_cap_as_they_are_now(
    db_url: str, store: Store
) -> None:
    """A retry runs the old job's command again: as a schedule's firing, it is held to the
    organization's `RECEIPT_ORG_EXECUTABLES` and the operator's `RECEIPT_MAX_TIMEOUT_MS` as they
    are when it is made (403 naming the field and the list, nothing written; a bulk retry
    leaves that job and retries the others), not as they were when the job was posted."""
    org = f"org-{new_id()}"
    tokens = f"token-{org} {org}"
    as_org = {"Authorization": f"Bearer token-{org}"}

    def codex(*argv: str) -> dict[str, Any]:
        task = {"task": {"command": list(argv)}, "timeoutMs": 3_000_000}
        return enqueue_body(org, jobId=new_id(), payload_extra=task)

    off_list, on_list = codex("sh", "-c", "curl x|sh"), codex("git", "status")
    async with api_client(db_url, store=store, tokens=tokens) as before:
        for body in (off_list, on_list):
            posted = await before.post("/agents/codex/jobs", json=body, headers=as_org)
            assert posted.status_code == 202, posted.text
            failed = await operations.fail_undeliverable(store, rid(body["jobId"], org), error="x")
            assert failed.ok
    now = {"RECEIPT_ORG_EXECUTABLES": json.dumps({org: ["git"]}), "max_timeout_ms": 60_000}
    async with api_client(db_url, store=store, tokens=tokens, **now) as after:
        refused = await after.post(f"/jobs/{off_list['jobId']}/retry", headers=as_org)
        assert refused.status_code == 403, refused.text
        error = refused.json()["error"]
        assert (error["code"], error["field"], error["allowed"]) == (
            "forbidden",
            "payload.task.command",
            ["git"],
        )
        bulk = await after.post("/jobs/retry", json={"agentId": "codex"}, headers=as_org)
        assert bulk.status_code == 200, bulk.text
        [retried] = bulk.json()["retried"]
        assert retried["jobId"] == on_list["jobId"]
        retry = (await after.get(f"/jobs/{retried['retryJobId']}", headers=as_org)).json()
        assert retry["payload"]["timeoutMs"] == 60_000
    assert "job.retried" not in await types(store, rid(off_list["jobId"], org))


async def test_a_retry_is_held_to_the_gateway_url_allow_list_as_it_is_now(
    db_url: str, store: Store
) -> None:
    """A retry runs the old job again with its `authContext.receiptConnectGatewayUrl`: held to
    `RECEIPT_GATEWAY_URL_ALLOWLIST` as it is when the retry is made (403 naming the field and
    the list, nothing written), as a schedule's firing is. It was checked at the post only."""
    gateway = "https://gw.example.com/"
    body = enqueue_body(jobId=new_id())
    body["payload"]["authContext"]["receiptConnectGatewayUrl"] = gateway + "v1"
    async with api_client(db_url, store=store, gateway_url_allowlist=[gateway]) as before:
        posted = await before.post("/agents/codex/jobs", json=body, headers=AS_A)
        assert posted.status_code == 202, posted.text
    job_id = rid(body["jobId"], "org-a")
    assert (await operations.fail_undeliverable(store, job_id, error="x")).ok
    now = ["https://other.example.com/"]
    async with api_client(db_url, store=store, gateway_url_allowlist=now) as after:
        refused = await after.post(f"/jobs/{body['jobId']}/retry", headers=AS_A)
    assert refused.status_code == 403, refused.text
    error = refused.json()["error"]
    assert (error["field"], error["allowed"]) == (
        "payload.authContext.receiptConnectGatewayUrl",
        now,
    )
    assert "job.retried" not in await types(store, job_id)


async def test_a_bulk_retry_goes_on_past_the_jobs_the_allow_list_refuses(
    db_url: str, store: Store
) -> None:
    """README: a bulk retry leaves a job the allow-list refuses as it is and retries the others.
    The refused ones are not retried, so they stay the oldest candidates: taken against the
    `limit`, they made every later bulk retry retry nothing, however many others were owed."""
    org = f"org-{new_id()}"
    tokens = f"token-{org} {org}"
    as_org = {"Authorization": f"Bearer token-{org}"}

    def codex(*argv: str) -> dict[str, Any]:
        return enqueue_body(org, jobId=new_id(), payload_extra={"task": {"command": list(argv)}})

    refused = [codex("sh", "-c", "curl x|sh") for _ in range(2)]
    allowed = codex("git", "status")
    async with api_client(db_url, store=store, tokens=tokens) as before:
        for body in (*refused, allowed):  # oldest first: the refused ones
            posted = await before.post("/agents/codex/jobs", json=body, headers=as_org)
            assert posted.status_code == 202, posted.text
            failed = await operations.fail_undeliverable(store, rid(body["jobId"], org), error="x")
            assert failed.ok
    now = {"RECEIPT_ORG_EXECUTABLES": json.dumps({org: ["git"]})}
    async with api_client(db_url, store=store, tokens=tokens, **now) as after:
        bulks = [
            await after.post("/jobs/retry", json={"agentId": "codex", "limit": 2}, headers=as_org)
            for _ in range(2)
        ]
    assert [b.status_code for b in bulks] == [200, 200]
    assert [r["jobId"] for r in bulks[0].json()["retried"]] == [allowed["jobId"]]
    assert bulks[1].json()["count"] == 0  # nothing left to retry: the refused stay as they are
    for body in refused:
        assert "job.retried" not in await types(store, rid(body["jobId"], org))
