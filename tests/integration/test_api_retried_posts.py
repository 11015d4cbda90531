"""A post sent again, after its answer was lost, makes nothing a second time: a post that names
no id of its own names what it makes by its `Idempotency-Key`, as an enqueue does (README,
"HTTP API"). Each test sends the same post twice at once, as a client retrying a post whose
answer did not come back does, against the app and real PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client import REGISTRY

from receipts.webhooks import WebhookSettings
from tests.integration.api_support import AS_A, AS_B, api_client, enqueue_body
from tests.integration.test_schedules import body as schedule_body


@pytest.fixture(scope="module")
async def client(db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    receivers = WebhookSettings(RECEIPT_WEBHOOK_ALLOWED_HOSTS="127.0.0.1")
    async with api_client(db_url, webhooks=receivers) as client:
        yield client


def enqueued(outcome: str) -> float:
    labels = {"lane": "collect", "kind": "factory.run", "agent": "factory", "outcome": outcome}
    return REGISTRY.get_sample_value("receipt_jobs_enqueued_total", labels) or 0.0


def keyed() -> dict[str, str]:
    return {**AS_A, "Idempotency-Key": f"key-{uuid.uuid4().hex}"}


async def steerable_job(client: httpx.AsyncClient) -> str:
    """A queued codex job that reads steers; its id."""
    job_id = f"steered-{uuid.uuid4().hex[:10]}"
    body = enqueue_body(
        jobId=job_id, payload_extra={"task": {"command": ["true"], "steerable": True}}
    )
    assert (await client.post("/agents/codex/jobs", json=body, headers=AS_A)).status_code == 202
    return job_id


async def twice(
    client: httpx.AsyncClient, method: str, url: str, **kwargs: object
) -> list[httpx.Response]:
    sent = (client.request(method, url, **kwargs) for _ in range(2))  # type: ignore[arg-type]
    return list(await asyncio.gather(*sent))


async def test_an_objective_posted_again_with_its_idempotency_key_is_made_once(
    client: httpx.AsyncClient,
) -> None:
    objective = {
        "title": "t",
        "goal": "g",
        "tasks": [{"taskId": "t", "input": {"command": ["true"]}}],
    }
    headers = keyed()
    before = {outcome: enqueued(outcome) for outcome in ("created", "existing")}
    answers = await twice(client, "POST", "/objectives", json=objective, headers=headers)
    assert [a.status_code for a in answers] == [202, 202], answers[0].text
    assert sorted(a.json()["outcome"] for a in answers) == ["created", "existing"]
    assert len({a.json()["objectiveId"] for a in answers}) == 1
    assert len({a.json()["job"]["jobId"] for a in answers}) == 1
    # Counted as an enqueue is: one created, one existing.
    assert {o: enqueued(o) - n for o, n in before.items()} == {"created": 1, "existing": 1}
    # Later too, and another key is another objective.
    again = await client.post("/objectives", json=objective, headers=headers)
    assert again.json()["objectiveId"] == answers[0].json()["objectiveId"]
    other = await client.post("/objectives", json=objective, headers=keyed())
    assert other.json()["objectiveId"] != answers[0].json()["objectiveId"]


async def test_another_objective_under_an_idempotency_key_is_refused_not_dropped(
    client: httpx.AsyncClient,
) -> None:
    """The key named the first objective, so another body under it was answered 202 `existing`
    with the first (its tasks, not these): the caller told its objective was accepted while it
    was dropped, uncounted. A schedule's or a webhook's other body under its key is 409."""
    objective = {
        "title": "t",
        "goal": "g",
        "tasks": [{"taskId": "t", "input": {"command": ["true"]}}],
    }
    headers = keyed()
    first = await client.post("/objectives", json=objective, headers=headers)
    assert first.status_code == 202, first.text
    other = await client.post("/objectives", json={**objective, "goal": "h"}, headers=headers)
    assert other.status_code == 409, other.text
    assert other.json()["error"]["field"] == "Idempotency-Key"
    again = await client.post("/objectives", json=objective, headers=headers)
    assert (again.status_code, again.json()["outcome"]) == (202, "existing"), again.text


async def test_a_schedule_posted_again_with_its_idempotency_key_is_made_once(
    client: httpx.AsyncClient,
) -> None:
    body = schedule_body(interval="60s")
    del body["scheduleId"]
    headers = keyed()
    answers = await twice(client, "POST", "/schedules", json=body, headers=headers)
    assert sorted(a.status_code for a in answers) == [200, 201], answers[0].text
    assert len({a.json()["scheduleId"] for a in answers}) == 1
    changed = await client.post("/schedules", json={**body, "interval": "120s"}, headers=headers)
    assert changed.status_code == 409, changed.text
    # The caller named no scheduleId: the 409 names what it sent, as a webhook's does.
    assert changed.json()["error"]["field"] == "Idempotency-Key", changed.text


async def test_a_command_sent_again_with_its_idempotency_key_is_appended_once(
    client: httpx.AsyncClient,
) -> None:
    job_id = await steerable_job(client)
    steer = {"type": "steer", "payload": {"say": "use the other file"}}
    headers = keyed()
    answers = await twice(client, "POST", f"/jobs/{job_id}/commands", json=steer, headers=headers)
    assert [a.status_code for a in answers] == [202, 202], answers[0].text
    assert len({a.json()["commandId"] for a in answers}) == 1
    job = (await client.get(f"/jobs/{job_id}", headers=AS_A)).json()
    assert [c["type"] for c in job["pendingCommands"]] == ["steer"]
    # An abort that canceled the queued job: its retry is told so, not 409 terminal_state.
    abort = keyed()
    first = await client.post(f"/jobs/{job_id}/commands", json={"type": "abort"}, headers=abort)
    assert first.status_code == 202, first.text
    again = await client.post(f"/jobs/{job_id}/commands", json={"type": "abort"}, headers=abort)
    assert again.status_code == 202, again.text
    assert again.json()["commandId"] == first.json()["commandId"]
    assert again.json()["job"]["status"] == "canceled"
    # The same key for another command is refused, as a job id's other body is not taken.
    other = await client.post(f"/jobs/{job_id}/commands", json=steer, headers=abort)
    assert other.status_code == 409, other.text


async def test_another_steer_under_a_used_idempotency_key_is_refused_not_dropped(
    client: httpx.AsyncClient,
) -> None:
    job_id = await steerable_job(client)
    headers = keyed()
    steer = {"type": "steer", "payload": {"say": "use the other file"}, "reason": "typo"}
    first = await client.post(f"/jobs/{job_id}/commands", json=steer, headers=headers)
    assert first.status_code == 202, first.text
    again = await client.post(f"/jobs/{job_id}/commands", json=steer, headers=headers)
    assert again.status_code == 202, again.text
    assert again.json()["commandId"] == first.json()["commandId"]
    # Another payload, or another reason, under the key is another post: told so, not
    # answered with the first while its words are dropped.
    for other in (
        {**steer, "payload": {"say": "rather the first file"}},
        {**steer, "reason": None},
    ):
        refused = await client.post(f"/jobs/{job_id}/commands", json=other, headers=headers)
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["field"] == "Idempotency-Key"
    job = (await client.get(f"/jobs/{job_id}", headers=AS_A)).json()
    assert [c["type"] for c in job["pendingCommands"]] == ["steer"]


async def test_a_webhook_created_again_with_its_idempotency_key_is_made_once(
    client: httpx.AsyncClient,
) -> None:
    # Two subscriptions to one URL post every event twice, the first signed with a secret
    # its caller never heard.
    body = {"url": f"http://127.0.0.1:9/{uuid.uuid4().hex}", "events": ["job.completed"]}
    headers = keyed()
    answers = await twice(client, "POST", "/webhooks", json=body, headers=headers)
    assert sorted(a.status_code for a in answers) == [200, 201], answers[0].text
    assert len({a.json()["webhook"]["webhookId"] for a in answers}) == 1
    assert len({a.json()["secret"] for a in answers}) == 1
    listed = (await client.get("/webhooks", params={"limit": 100}, headers=AS_A)).json()
    assert [w["url"] for w in listed["webhooks"]].count(body["url"]) == 1
    # Another organization's same key is its own subscription; another body under it is 409.
    theirs = await client.post(
        "/webhooks", json=body, headers={**AS_B, **{"Idempotency-Key": headers["Idempotency-Key"]}}
    )
    assert theirs.status_code == 201, theirs.text
    assert theirs.json()["webhook"]["webhookId"] != answers[0].json()["webhook"]["webhookId"]
    other = await client.post("/webhooks", json={**body, "events": ["job.failed"]}, headers=headers)
    assert other.status_code == 409, other.text


# Numbers `jsonb` gives back in another form than the float a request's JSON holds: 1.5e300
# as an integer of 301 digits, 1e23 as 10**23 (neither equal to the float), -0.0 as 0.0.
NUMBERS = {"big": 1.5e300, "round": 1e23, "zero": -0.0, "one": 1.0, "small": 1e-7}


@pytest.mark.parametrize("post", ["steer", "schedule", "enqueue"])
async def test_a_post_holding_floats_sent_again_with_its_key_is_the_same_post(
    client: httpx.AsyncClient, post: str
) -> None:
    """The first post's body is compared with the one sent again as `jsonb` gave it back: the
    float 1.5e300 came back the integer 15 followed by 299 zeros, not equal in Python, so the
    identical post sent again (its answer lost) was a 409 `conflict` (a steer, a schedule) or
    an enqueue flagged `idempotencyMismatch` (an objective's body holds no free number: its
    fields are checked). Numbers compare by value."""
    headers = keyed()
    if post == "steer":
        url, body = f"/jobs/{await steerable_job(client)}/commands", {"type": "steer"}
        body["payload"] = {"say": "use the other file", **NUMBERS}
    elif post == "schedule":
        url, body = "/schedules", schedule_body(interval="60s")
        del body["scheduleId"]
        body["job"]["payload"]["numbers"] = NUMBERS
    else:
        url = "/agents/codex/jobs"
        body = enqueue_body(payload_extra={"task": {"command": ["true"]}, "numbers": NUMBERS})
    first = await client.post(url, json=body, headers=headers)
    assert first.status_code in (201, 202), first.text
    again = await client.post(url, json=body, headers=headers)
    assert again.status_code in (200, 202), again.text
    if post == "enqueue":
        assert again.json()["outcome"] == "existing", again.text
        assert not again.json()["async"]["idempotencyMismatch"], again.text
    # A number that differs is another post still.
    changed = {**NUMBERS, "big": 1.4e300}
    if post == "steer":
        other = {**body, "payload": {**body["payload"], **changed}}
        assert (await client.post(url, json=other, headers=headers)).status_code == 409
    elif post == "schedule":
        other = {**body, "job": {**body["job"], "payload": {**body["job"]["payload"]}}}
        other["job"]["payload"]["numbers"] = changed
        assert (await client.post(url, json=other, headers=headers)).status_code == 409
