"""The HTTP API in-process against real PostgreSQL: every route, every status code, one error shape."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import psycopg
import pytest
from fastapi import Request
from psycopg_pool import AsyncConnectionPool

from receipts import assembly
from receipts import operations as ops
from receipts.jobs import LANES, SINGLETON_MODES
from receipts.kinds import (
    AGENT_IDS,
    CONTRACTS,
    KINDS,
    QUEUE_CHAT,
    QUEUE_CODEX,
    QUEUE_CONTROL,
    installed_agent_ids,
)
from receipts.schema import latest_schema_version
from receipts.store import Store
from roles.api.deps import clean_params
from tests.integration.api_support import AS_A, AS_ADMIN, AS_B, api_client, enqueue_body, rid
from tests.integration.helpers import new_id, types

LEASE_MS = 60_000


@pytest.fixture(scope="module")
async def client(db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(db_url, max_body_bytes=4096) as client:
        yield client


def assert_error(
    response: httpx.Response, status: int, code: str, field: str | None = None
) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) <= {"code", "message", "field", "allowed"}
    assert error["code"] == code and error["message"]
    if field is not None:
        assert error["field"] == field
    return dict(error)


async def post(
    client: httpx.AsyncClient, body: Any, agent: str = "codex", headers: dict[str, str] = AS_A
) -> httpx.Response:
    return await client.post(f"/agents/{agent}/jobs", json=body, headers=headers)


async def enqueued(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await post(client, enqueue_body(**body))
    assert response.status_code == 202, response.text
    job: dict[str, Any] = response.json()["job"]
    return job


# --- health -----------------------------------------------------------------------------------


async def test_healthz_and_readyz(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "schemaVersion": latest_schema_version()}


async def test_readyz_is_503_on_a_database_that_is_not_migrated(make_database: Any) -> None:
    url = make_database(migrated=False)
    async with api_client(url) as client:
        response = await client.get("/readyz")
    assert_error(response, 503, "not_migrated")
    assert response.headers["retry-after"].isdigit()


async def test_openapi_schema_and_docs_are_published(client: httpx.AsyncClient) -> None:
    schema = (await client.get("/openapi.json")).json()
    assert {
        "/agents/{agentId}/jobs",
        "/jobs",
        "/jobs/{jobId}",
        "/jobs/{jobId}/events",
        "/jobs/{jobId}/commands",
        "/healthz",
        "/readyz",
    } <= set(schema["paths"])
    kinds = schema["components"]["schemas"]["EnqueuePayload"]["properties"]["kind"]["enum"]
    assert kinds == list(KINDS)
    # Optional choices may be null, as the API takes them (a validator of the document refused
    # the specification's own body with `"lane": null` before).
    body = schema["components"]["schemas"]["EnqueueBody"]["properties"]
    for name in ("lane", "singletonMode"):
        assert {"type": "null"} in body[name]["anyOf"], body[name]
    # Every route that checks a scope documents its 403.
    for path, method in (
        ("/agent-jobs/{agentJobId}", "get"),
        ("/sessions/{sessionId}/agent-jobs", "get"),
        ("/agent-jobs/{agentJobId}/input", "post"),
    ):
        assert "403" in schema["paths"][path][method]["responses"], path
    docs = await client.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


# --- enqueue ----------------------------------------------------------------------------------


async def test_enqueue_answers_202_with_the_job_and_where_to_follow_it(
    client: httpx.AsyncClient, store: Store
) -> None:
    job_id = new_id()
    response = await post(client, enqueue_body(jobId=job_id, lane="chat", maxAttempts=3))
    assert response.status_code == 202
    body = response.json()
    job = body["job"]
    assert (job["jobId"], job["status"], job["lane"], job["maxAttempts"]) == (
        job_id,
        "queued",
        "chat",
        3,
    )
    assert body["outcome"] == "created"
    assert body["async"] == {
        "jobId": job_id,
        "stream": f"jobs/{job_id}",
        "jobUrl": f"/jobs/{job_id}",
        "eventsUrl": f"/jobs/{job_id}/events",
        "status": "queued",
        "idempotencyMismatch": False,
    }
    assert await types(store, rid(job_id)) == ["job.enqueued"]
    assert (await client.get(body["async"]["jobUrl"], headers=AS_A)).json()["jobId"] == job_id
    events = (await client.get(body["async"]["eventsUrl"], headers=AS_A)).json()
    assert [r["type"] for r in events["receipts"]] == ["job.enqueued"]


@pytest.mark.parametrize("job_id", [".", ".."])
async def test_the_urls_an_enqueue_answers_reach_a_job_whose_id_is_a_dot_segment(
    client: httpx.AsyncClient, job_id: str
) -> None:
    """The job id pattern takes `.` and `..`; the answer's `jobUrl` and `eventsUrl` still name
    that job once a client resolves them (left bare, `/jobs/..` is `/` and `/jobs/./events` is
    `/jobs/events`: the job list, and an unknown job)."""
    response = await post(client, enqueue_body("org-b", jobId=job_id), headers=AS_B)
    assert response.status_code == 202, response.text
    urls = response.json()["async"]
    job = await client.get(urls["jobUrl"], headers=AS_B)
    assert job.status_code == 200 and job.json().get("jobId") == job_id, job.text
    events = await client.get(urls["eventsUrl"], headers=AS_B)
    assert events.status_code == 200, events.text
    assert events.json()["jobId"] == job_id
    assert events.json()["receipts"][0]["type"] == "job.enqueued"


async def test_an_idempotent_repost_answers_202_with_the_same_job(
    client: httpx.AsyncClient, store: Store
) -> None:
    job_id = new_id()
    first = await post(client, enqueue_body(jobId=job_id))
    again = await post(client, enqueue_body(jobId=job_id, lane="chat"))
    assert again.status_code == 202
    assert again.json()["outcome"] == "existing"
    assert again.json()["job"] == first.json()["job"]
    assert await types(store, rid(job_id)) == ["job.enqueued"]


async def test_a_steer_absorbed_into_an_active_job_answers_202_with_that_job(
    client: httpx.AsyncClient,
) -> None:
    session = new_id("session")
    first = await enqueued(client, sessionKey=session)
    response = await post(
        client, enqueue_body(sessionKey=session, singletonMode="steer", payload_extra={"n": 2})
    )
    assert response.status_code == 202
    body = response.json()
    assert body["outcome"] == "steered"
    assert body["job"]["jobId"] == first["jobId"]
    [steer] = body["job"]["pendingCommands"]
    # The job keeps a reference to the steer's receipt; the payload is read from the receipt.
    assert steer["type"] == "steer" and "payload" not in steer
    after = steer["seq"] - 1
    events = await client.get(f"/jobs/{first['jobId']}/events?after={after}&limit=1", headers=AS_A)
    [receipt] = events.json()["receipts"]
    assert (receipt["type"], receipt["data"]["payload"]["n"]) == ("queue.command", 2)


async def test_an_unknown_agent_id_is_accepted_and_routed_to_chat(
    client: httpx.AsyncClient,
) -> None:
    response = await post(client, enqueue_body(), agent="nobody-handles-me")
    assert response.status_code == 202
    job = response.json()["job"]
    assert (job["agentId"], job["route"], job["agentHasHandler"]) == (
        "nobody-handles-me",
        QUEUE_CHAT,
        False,
    )


async def test_strict_agent_ids_refuse_an_unknown_agent_with_404_naming_the_known_ones(
    db_url: str,
) -> None:
    """The four built-in agents, then the installed ones (the example's, in the test
    environment)."""
    async with api_client(db_url, strict_agent_ids=True) as strict:
        response = await post(strict, enqueue_body(jobId=new_id()), agent="nobody")
        error = assert_error(response, 404, "unknown_agent", "agentId")
        known = [*AGENT_IDS, *sorted(installed_agent_ids())]
        assert "release-bot" in known
        assert error["allowed"] == known
        assert all(agent in error["message"] for agent in known)
        assert (await post(strict, enqueue_body(), agent="release-bot")).status_code == 202
        assert (await post(strict, enqueue_body(), agent="factory")).status_code == 202


async def test_unknown_kind_is_422_naming_the_nine_and_writes_nothing(
    client: httpx.AsyncClient,
) -> None:
    job_id = new_id()
    response = await post(client, enqueue_body(kind="factory.nope", jobId=job_id))
    error = assert_error(response, 422, "invalid_input", "payload.kind")
    assert error["allowed"] == list(KINDS)
    assert all(kind in error["message"] for kind in KINDS)
    assert (await client.get(f"/jobs/{job_id}", headers=AS_A)).status_code == 404


@pytest.mark.parametrize("kind", KINDS)
async def test_each_kind_posted_as_the_spec_shapes_it_without_an_objective_id(
    client: httpx.AsyncClient, kind: str
) -> None:
    """The spec requires `kind` and `authContext` only. A kind that acts on an objective cannot
    run without one (422 naming the field, nothing written); `factory.run` is given a new
    objective id; `factory.task.run` runs on its own; the watchdog names none."""
    job_id = new_id()
    payload: dict[str, Any] = {"kind": kind}
    if kind != "factory.objective.watchdog":
        payload["authContext"] = {"userId": "u-1", "organizationId": "org-a"}
        if kind == "factory.run":
            payload["objective"] = {"title": "t", "goal": "g", "tasks": []}
        headers = AS_A
    else:
        headers = AS_ADMIN
    agent = {"factory.run": "factory", "factory.task.run": "codex"}.get(kind, "factory-control")
    response = await client.post(
        f"/agents/{agent}/jobs", json={"jobId": job_id, "payload": payload}, headers=headers
    )
    if CONTRACTS[kind].objective_required:
        error = assert_error(response, 422, "invalid_input", "payload.objectiveId")
        assert kind in error["message"] and "factory.task.run" in error["message"]
        assert (await client.get(f"/jobs/{job_id}", headers=headers)).status_code == 404
        return
    assert response.status_code == 202, response.text
    shown = response.json()["job"]["payload"]
    if kind == "factory.run":
        assert isinstance(shown["objectiveId"], str) and "~" not in shown["objectiveId"]
    else:
        assert "objectiveId" not in shown


async def test_the_watchdog_kind_is_the_runtimes_own(client: httpx.AsyncClient) -> None:
    """It scans every organization's objectives: an organization's token may not post it, with
    or without an authContext of its own."""
    for payload in (
        {"kind": "factory.objective.watchdog"},
        {
            "kind": "factory.objective.watchdog",
            "authContext": {"userId": "u", "organizationId": "org-a"},
        },
    ):
        response = await client.post(
            "/agents/factory-control/jobs", json={"payload": payload}, headers=AS_A
        )
        assert_error(response, 403, "forbidden", "payload.kind")


@pytest.mark.parametrize("missing", ["userId", "organizationId"])
async def test_missing_auth_context_field_is_422_naming_it(
    client: httpx.AsyncClient, missing: str
) -> None:
    body = enqueue_body(jobId=new_id())
    del body["payload"]["authContext"][missing]
    response = await post(client, body, headers=AS_ADMIN)
    assert_error(response, 422, "invalid_input", f"payload.authContext.{missing}")
    assert (await client.get(f"/jobs/{rid(body['jobId'])}", headers=AS_ADMIN)).status_code == 404


@pytest.mark.parametrize(
    ("name", "allowed"), [("lane", list(LANES)), ("singletonMode", list(SINGLETON_MODES))]
)
async def test_unknown_lane_or_singleton_mode_is_422_naming_the_allowed_values(
    client: httpx.AsyncClient, name: str, allowed: list[str]
) -> None:
    response = await post(client, enqueue_body(**{name: "sideways"}))
    assert assert_error(response, 422, "invalid_input", name)["allowed"] == allowed


async def test_unknown_top_level_field_is_422(client: httpx.AsyncClient) -> None:
    response = await post(client, enqueue_body(singleton_mode="cancel"))
    error = assert_error(response, 422, "invalid_input", "singleton_mode")
    assert "singletonMode" in error["allowed"]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"payload": ',
        b"",
        b"   ",
        b'{"payload": {"kind": "factory.run"}, "maxAttempts": NaN}',
        b'{"maxAttempts": 1e999}',
        b'{"payload": "\xff\xfe"}',
    ],
    ids=["truncated", "empty", "blank", "nan", "infinity", "not-utf8"],
)
async def test_malformed_json_is_400(client: httpx.AsyncClient, raw: bytes) -> None:
    response = await client.post(
        "/agents/codex/jobs",
        content=raw,
        headers={**AS_A, "Content-Type": "application/json"},
    )
    assert_error(response, 400, "malformed_json")


async def test_a_body_nested_too_deeply_is_422(client: httpx.AsyncClient) -> None:
    deep: Any = "leaf"
    for _ in range(70):
        deep = [deep]
    response = await post(client, enqueue_body(payload_extra={"deep": deep}))
    assert_error(response, 422, "invalid_input", "body")


@pytest.mark.parametrize("delay", [{}, "", False, 1.5, -1])
async def test_a_delay_that_is_not_a_whole_number_of_ms_is_422(
    client: httpx.AsyncClient, delay: Any
) -> None:
    assert_error(await post(client, enqueue_body(delayMs=delay)), 422, "invalid_input", "delayMs")


async def test_a_delay_written_as_a_whole_float_is_that_many_ms(
    client: httpx.AsyncClient, store: Store
) -> None:
    """JSON does not tell 1000 from 1000.0 (a JavaScript client's arithmetic writes either):
    `maxAttempts: 2.0` was taken and `delayMs: 1000.0` refused with 422."""
    job_id = new_id()
    response = await post(client, enqueue_body(jobId=job_id, delayMs=60_000.0))
    assert response.status_code == 202, response.text
    job = await store.get_job(rid(job_id))
    assert job is not None and job.available_at is not None
    assert job.available_at - job.created_at == timedelta(milliseconds=60_000)


async def test_a_body_that_is_not_an_object_is_422(client: httpx.AsyncClient) -> None:
    assert_error(await post(client, [1, 2]), 422, "invalid_input", "body")


async def test_a_body_over_the_limit_is_413_by_content_length(client: httpx.AsyncClient) -> None:
    body = enqueue_body(jobId=new_id(), payload_extra={"blob": "x" * 5000})
    response = await post(client, body)
    assert_error(response, 413, "body_too_large")
    assert (await client.get(f"/jobs/{body['jobId']}", headers=AS_A)).status_code == 404


async def test_a_body_declared_too_large_is_413_before_it_spends_a_rate_token(
    db_url: str,
) -> None:
    # One token and no refill: a refused body must not take it, whatever the flood sends.
    async with api_client(
        db_url, max_body_bytes=4096, org_enqueue_rate=1e-6, org_enqueue_burst=1
    ) as limited:
        big = enqueue_body(jobId=new_id(), payload_extra={"blob": "x" * 5000})
        for _ in range(3):
            assert_error(await post(limited, big), 413, "body_too_large")
        assert (await post(limited, enqueue_body(jobId=new_id()))).status_code == 202
        assert_error(await post(limited, enqueue_body(jobId=new_id())), 429, "too_many_requests")


async def test_the_gate_refuses_a_flood_before_the_route_and_admits_each_token_once(
    db_url: str,
) -> None:
    from receipts import metrics

    def counted() -> float:
        return metrics.API_REQUESTS.labels("/agents/{agentId}/jobs", "POST", "429")._value.get()

    async with api_client(db_url, org_enqueue_rate=1e-6, org_enqueue_burst=2) as limited:
        # Two tokens, two enqueues: the gate's take is the only one (no second in the route).
        for _ in range(2):
            assert (await post(limited, enqueue_body(jobId=new_id()))).status_code == 202
        before = counted()
        # The route would answer this one 422 (a query parameter it does not take); the gate
        # refuses it first, without routing it.
        refused = await limited.post(
            "/agents/codex/jobs?bogus=1", json=enqueue_body(jobId=new_id()), headers=AS_A
        )
        assert_error(refused, 429, "too_many_requests")
        assert int(refused.headers["retry-after"]) >= 1
        assert counted() == before + 1
        # Without a valid token the gate leaves the answer to the route.
        unknown = await limited.post(
            "/agents/codex/jobs",
            json=enqueue_body(jobId=new_id()),
            headers={"Authorization": "Bearer not-a-token"},
        )
        assert unknown.status_code == 401
        # Another organization has tokens of its own.
        assert (
            await post(limited, enqueue_body("org-b", jobId=new_id()), headers=AS_B)
        ).status_code == 202


async def test_the_gate_answers_a_well_formed_enqueue_without_routing_it(db_url: str) -> None:
    from receipts import metrics

    routed: list[str] = []

    async def counted_params(request: Request) -> None:
        # Every request the router hands to a route resolves this app-wide dependency.
        routed.append(request.url.path)
        await clean_params(request)

    def answered() -> float:
        return metrics.API_REQUESTS.labels("/agents/{agentId}/jobs", "POST", "202")._value.get()

    async with api_client(db_url, overrides={clean_params: counted_params}) as client:
        before = answered()
        assert (await post(client, enqueue_body(jobId=new_id()))).status_code == 202
        keyed = await client.post(
            "/agents/codex/jobs",
            json=enqueue_body(),
            headers={**AS_A, "Idempotency-Key": new_id()},
        )
        assert keyed.status_code == 202, keyed.text
        # Failures a route raises on purpose answer as the app's handlers answer them.
        assert_error(
            await post(client, {"payload": {"kind": "nope"}}), 422, "invalid_input", "payload.kind"
        )
        assert_error(await post(client, enqueue_body("org-b")), 403, "forbidden")
        assert routed == []
        assert answered() == before + 2  # counted under the route's template, as routed ones
        # A query, a key or an agent id the route's parameters refuse: the route answers.
        assert_error(
            await client.post("/agents/codex/jobs?x=1", json=enqueue_body(), headers=AS_A),
            422,
            "invalid_input",
            "x",
        )
        bad_key = await client.post(
            "/agents/codex/jobs", json=enqueue_body(), headers={**AS_A, "Idempotency-Key": "a b"}
        )
        assert_error(bad_key, 422, "invalid_input", "Idempotency-Key")
        assert_error(await post(client, enqueue_body(), agent="a" * 201), 422, "invalid_input")
        assert len(routed) == 3

    routed.clear()
    # Open (no tokens, loopback): the gate answers too, the open API's own checks first.
    async with api_client(
        db_url,
        tokens=None,
        host="127.0.0.1",
        base_url="http://127.0.0.1:8000",
        overrides={clean_params: counted_params},
    ) as open_api:
        assert (await open_api.post("/agents/codex/jobs", json=enqueue_body())).status_code == 202
        drive_by = await open_api.post(
            "/agents/codex/jobs",
            content=json.dumps(enqueue_body()),
            headers={"Content-Type": "text/plain"},
        )
        assert_error(drive_by, 415, "unsupported_media_type", "Content-Type")
        assert routed == []


async def test_a_streamed_body_over_the_limit_is_413(client: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"payload": {"kind": "factory.run", "blob": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}}'

    response = await client.post("/agents/codex/jobs", content=chunks(), headers=AS_A)
    assert "content-length" not in response.request.headers
    assert_error(response, 413, "body_too_large")


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ('"nul\\u0000here"', "payload.note"),
        ('"lone \\ud800 surrogate"', "payload.note"),
        ('"lone \\udfff low"', "payload.note"),
    ],
)
async def test_nul_and_lone_surrogates_are_422_and_never_reach_postgresql(
    client: httpx.AsyncClient, raw: str, field: str
) -> None:
    job_id = new_id()
    # json.dumps cannot write these; splice the raw escape into an otherwise valid body.
    text = json.dumps(enqueue_body(jobId=job_id, payload_extra={"note": "@"})).replace('"@"', raw)
    response = await client.post("/agents/codex/jobs", content=text.encode(), headers=AS_A)
    assert_error(response, 422, "invalid_input", field)
    assert (await client.get(f"/jobs/{job_id}", headers=AS_A)).status_code == 404


async def test_nul_in_a_key_or_the_path_is_422(client: httpx.AsyncClient) -> None:
    text = '{"payload": {"kind": "factory.run", "k\\u0000": 1}}'
    response = await client.post("/agents/codex/jobs", content=text.encode(), headers=AS_A)
    assert_error(response, 422, "invalid_input")
    assert_error(await client.get("/jobs/a%00b", headers=AS_A), 422, "invalid_input", "jobId")
    assert_error(await client.get("/jobs?agentId=%00", headers=AS_A), 422, "invalid_input")


async def test_a_paired_surrogate_escape_is_fine(client: httpx.AsyncClient) -> None:
    job = await enqueued(client, payload_extra={"emoji": "\U0001f600"})
    assert job["payload"]["emoji"] == "\U0001f600"


async def test_enqueue_for_another_organization_is_403(client: httpx.AsyncClient) -> None:
    job_id = new_id()
    response = await post(client, enqueue_body(org="org-b", jobId=job_id), headers=AS_A)
    assert_error(response, 403, "forbidden", "payload.authContext.organizationId")
    assert (await client.get(f"/jobs/{rid(job_id, 'org-b')}", headers=AS_ADMIN)).status_code == 404


async def test_a_job_id_used_by_another_organization_answers_as_an_unknown_one(
    client: httpx.AsyncClient, store: Store
) -> None:
    # Issue 12, finding 10: ids are scoped by organization, so org-b's post of org-a's id is
    # answered exactly as one of a fresh id (202, created), and org-a's job is untouched.
    job = await enqueued(client, jobId=new_id())
    fresh = new_id()
    for job_id in (job["jobId"], fresh):
        response = await post(client, enqueue_body(org="org-b", jobId=job_id), headers=AS_B)
        assert response.status_code == 202, response.text
        assert response.json()["outcome"] == "created"
        assert response.json()["job"]["jobId"] == job_id
        assert "org-a" not in response.text
    assert await types(store, rid(job["jobId"])) == ["job.enqueued"]
    assert await types(store, rid(job["jobId"], "org-b")) == ["job.enqueued"]


async def test_an_admin_may_enqueue_for_any_organization(client: httpx.AsyncClient) -> None:
    response = await post(client, enqueue_body(org="org-z"), headers=AS_ADMIN)
    assert response.status_code == 202
    assert response.json()["job"]["organizationId"] == "org-z"
    watchdog = {"payload": {"kind": "factory.objective.watchdog"}}
    assert (await post(client, watchdog, agent="factory-control", headers=AS_ADMIN)).is_success
    assert_error(await post(client, watchdog, agent="factory-control"), 403, "forbidden")


# --- authentication ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Basic dXNlcjpwYXNz"}],
    ids=["missing", "unknown", "basic"],
)
async def test_requests_without_a_valid_token_are_401(
    client: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    for response in (
        await client.get("/jobs", headers=headers),
        await client.get("/jobs/x", headers=headers),
        await client.post("/agents/codex/jobs", json=enqueue_body(), headers=headers),
    ):
        assert_error(response, 401, "unauthorized")
        assert response.headers["www-authenticate"] == "Bearer"


# --- reading a job ----------------------------------------------------------------------------


async def test_get_job_shows_route_contract_attempt_lease_and_pending_commands(
    client: httpx.AsyncClient, store: Store
) -> None:
    job = await enqueued(client, kind="factory.dispatch")
    job_id = job["jobId"]
    # Posted to `codex`: routing says codex, the contract says control (docs/design.md §5: show both).
    assert (job["route"], job["contractWorkerGroup"], job["contractQueue"]) == (
        QUEUE_CODEX,
        "control",
        QUEUE_CONTROL,
    )
    assert job["routeMatchesContract"] is False
    assert (job["attempt"], job["lease"], job["pendingCommands"]) == (0, None, [])
    worker = f"{job_id}:attempt:1/1"
    assert (await ops.lease(store, rid(job_id), attempt=1, worker_id=worker, lease_ms=LEASE_MS)).ok
    steer = await client.post(
        f"/jobs/{job_id}/commands", json={"type": "steer", "payload": {"n": 1}}, headers=AS_A
    )
    assert steer.status_code == 202
    shown = (await client.get(f"/jobs/{job_id}", headers=AS_A)).json()
    assert shown["attempt"] == 1 and shown["status"] == "leased"
    assert shown["lease"]["workerId"] == worker and shown["lease"]["attempt"] == 1
    assert [c["commandId"] for c in shown["pendingCommands"]] == [steer.json()["commandId"]]
    assert shown["stream"] == f"jobs/{job_id}"


async def test_route_and_contract_agree_for_a_control_job_on_factory_control(
    client: httpx.AsyncClient,
) -> None:
    response = await post(client, enqueue_body(kind="factory.run"), agent="factory-control")
    job = response.json()["job"]
    assert (job["route"], job["contractQueue"], job["routeMatchesContract"]) == (
        QUEUE_CONTROL,
        QUEUE_CONTROL,
        True,
    )


async def test_unknown_job_is_404(client: httpx.AsyncClient) -> None:
    for path in ("/jobs/no-such-job", "/jobs/no-such-job/events"):
        assert_error(await client.get(path, headers=AS_A), 404, "not_found", "jobId")
    response = await client.post("/jobs/no-such-job/commands", json={"type": "abort"}, headers=AS_A)
    assert_error(response, 404, "not_found", "jobId")


@pytest.mark.parametrize(
    "job_id", ["a/part", "x:gen:1", "x:attempt:2", "x:redrive:3:1", "watchdog:2026-01-01"]
)
async def test_job_ids_shaped_like_delivery_ids_are_refused(
    client: httpx.AsyncClient, job_id: str
) -> None:
    response = await post(client, enqueue_body(jobId=job_id))
    assert_error(response, 422, "invalid_input", "jobId")


async def test_a_cursor_holding_nul_is_refused_not_passed_to_postgres(
    client: httpx.AsyncClient,
) -> None:
    raw = json.dumps(["2020-01-01T00:00:00+00:00", "x\u0000"]).encode()
    cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    response = await client.get("/jobs", params={"cursor": cursor}, headers=AS_A)
    assert_error(response, 422, "invalid_input", "cursor")


async def test_a_huge_integer_timeout_is_accepted_and_does_not_break_timing(
    client: httpx.AsyncClient,
) -> None:
    from receipts.timing import TimingSettings, derive

    job = await enqueued(client, payload_extra={"timeoutMs": 10**400})
    timing = derive("codex", job["payload"], TimingSettings())
    assert timing.lease_ms == 3_600_000


async def test_events_are_the_receipts_in_order_after_a_seq(
    client: httpx.AsyncClient, store: Store
) -> None:
    job_id = (await enqueued(client))["jobId"]
    for n in range(3):
        response = await client.post(
            f"/jobs/{job_id}/commands", json={"type": "follow_up", "payload": n}, headers=AS_A
        )
        assert response.status_code == 202
    page = (await client.get(f"/jobs/{job_id}/events", headers=AS_A)).json()
    assert [r["seq"] for r in page["receipts"]] == [1, 2, 3, 4]
    assert [r["type"] for r in page["receipts"]] == await types(store, rid(job_id))
    assert (page["lastSeq"], page["status"], page["stream"]) == (4, "queued", f"jobs/{job_id}")
    later = (await client.get(f"/jobs/{job_id}/events?after=2&limit=1", headers=AS_A)).json()
    assert [r["seq"] for r in later["receipts"]] == [3] and later["lastSeq"] == 3
    done = (await client.get(f"/jobs/{job_id}/events?after=4", headers=AS_A)).json()
    assert (done["receipts"], done["lastSeq"]) == ([], 4)
    assert_error(
        await client.get(f"/jobs/{job_id}/events?after=-1", headers=AS_A),
        422,
        "invalid_input",
        "after",
    )


# --- commands ---------------------------------------------------------------------------------


async def test_commands_are_appended_and_answer_202_with_the_command_id(
    client: httpx.AsyncClient, store: Store
) -> None:
    job_id = (await enqueued(client))["jobId"]
    ids = []
    for command in (
        {"type": "steer", "payload": {"say": "left"}, "reason": "operator"},
        {"type": "follow_up", "payload": "and then"},
        {"type": "abort", "reason": "enough"},
    ):
        response = await client.post(f"/jobs/{job_id}/commands", json=command, headers=AS_A)
        assert response.status_code == 202, response.text
        body = response.json()
        assert (body["jobId"], body["type"]) == (job_id, command["type"])
        ids.append(body["commandId"])
    job = (await store.get_job(rid(job_id))).model_dump()  # type: ignore[union-attr]
    assert [c["command_id"] for c in job["commands"]] == ids
    assert job["abort_requested"] is True and job["abort_reason"] == "enough"
    # No worker held the queued job, so the abort canceled it in the same transaction.
    assert job["status"] == "canceled"
    # The steer and the follow-up it never read are settled with the cancel, just before it.
    assert await types(store, rid(job_id)) == ["job.enqueued"] + ["queue.command"] * 3 + [
        "queue.command.unconsumed",
        "queue.command.unconsumed",
        "job.canceled",
    ]


async def test_a_command_on_a_terminal_job_is_409_and_writes_nothing(
    client: httpx.AsyncClient, store: Store
) -> None:
    job_id = (await enqueued(client))["jobId"]
    assert (await ops.cancel_queued(store, rid(job_id), reason="test")).ok
    written = await types(store, rid(job_id))
    for kind in ("steer", "follow_up", "abort"):
        response = await client.post(f"/jobs/{job_id}/commands", json={"type": kind}, headers=AS_A)
        assert_error(response, 409, "terminal_state")
    assert await types(store, rid(job_id)) == written


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"type": "nudge"}, "type"),
        ({}, "type"),
        ({"type": "abort", "reason": 7}, "reason"),
        ({"type": "abort", "why": "x"}, "why"),
    ],
)
async def test_an_invalid_command_is_422(
    client: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    job_id = (await enqueued(client))["jobId"]
    error = assert_error(
        await client.post(f"/jobs/{job_id}/commands", json=body, headers=AS_A),
        422,
        "invalid_input",
        field,
    )
    if field == "type":
        assert error["allowed"] == ["steer", "follow_up", "abort"]


async def test_a_malformed_command_body_is_400(client: httpx.AsyncClient) -> None:
    job_id = (await enqueued(client))["jobId"]
    response = await client.post(f"/jobs/{job_id}/commands", content=b"{", headers=AS_A)
    assert_error(response, 400, "malformed_json")


# --- listing ----------------------------------------------------------------------------------


async def test_list_filters_and_pages_newest_first_with_a_cursor(
    client: httpx.AsyncClient, store: Store
) -> None:
    agent = new_id("agent")
    session = new_id("session")
    made = []
    for n in range(5):
        extra: dict[str, Any] = {"lane": "chat" if n % 2 else "collect"}
        if n < 3:
            extra["sessionKey"] = session
        response = await post(client, enqueue_body(kind="factory.run", **extra), agent=agent)
        made.append(response.json()["job"]["jobId"])
    newest_first = list(reversed(made))

    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"agentId": agent, "limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = (await client.get("/jobs", params=params, headers=AS_A)).json()
        seen += [job["jobId"] for job in page["jobs"]]
        pages += 1
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert seen == newest_first and pages == 3

    async def ids(**params: Any) -> list[str]:
        response = await client.get("/jobs", params={"agentId": agent, **params}, headers=AS_A)
        assert response.status_code == 200, response.text
        return [job["jobId"] for job in response.json()["jobs"]]

    assert await ids(lane="chat") == [made[3], made[1]]
    assert await ids(sessionKey=session) == [made[2], made[1], made[0]]
    assert await ids(kind="factory.run") == newest_first
    assert await ids(kind="factory.dispatch") == []
    assert (await ops.cancel_queued(store, rid(made[0]), reason="test")).ok
    assert await ids(status="canceled") == [made[0]]
    assert await ids(status="queued") == newest_first[:-1]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"status": "sleeping"}, "status"),
        ({"lane": "fast"}, "lane"),
        ({"kind": "factory.nope"}, "kind"),
        ({"limit": 0}, "limit"),
        ({"limit": 501}, "limit"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"agentId": ""}, "agentId"),
        ({"agent": "codex"}, "agent"),
    ],
)
async def test_list_rejects_bad_filters_with_422(
    client: httpx.AsyncClient, params: dict[str, Any], field: str
) -> None:
    assert_error(
        await client.get("/jobs", params=params, headers=AS_A), 422, "invalid_input", field
    )


async def test_an_unknown_route_and_method_answer_in_the_error_shape(
    client: httpx.AsyncClient,
) -> None:
    assert_error(await client.get("/nowhere", headers=AS_A), 404, "not_found")
    response = await client.delete("/jobs", headers=AS_A)
    assert_error(response, 405, "method_not_allowed")
    assert "GET" in response.headers["allow"]


# --- outage -----------------------------------------------------------------------------------


async def test_a_database_restart_between_requests_reaches_no_client(
    make_database: Any, server_url: str
) -> None:
    # The api's pool skips the round-trip check for a connection back within CHECK_IDLE_S; a
    # backend that ended meanwhile (a restart, a failover) left input on its idle connection,
    # so that one is checked and replaced before any request gets it.
    url = make_database()
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    async with api_client(url) as client:
        job = (await post(client, enqueue_body())).json()["job"]
        path = f"/jobs/{job['jobId']}"
        await asyncio.gather(*(client.get(path, headers=AS_A) for _ in range(6)))
        async with await psycopg.AsyncConnection.connect(server_url, autocommit=True) as admin:
            ended = await (
                await admin.execute(
                    "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity"
                    " WHERE datname = %s",
                    (name,),
                )
            ).fetchone()
        assert ended is not None and ended[0] >= 2
        answers = await asyncio.gather(*(client.get(path, headers=AS_A) for _ in range(6)))
        assert [a.status_code for a in answers] == [200] * 6
        assert (await post(client, enqueue_body())).status_code == 202


async def test_a_database_outage_is_503_with_retry_after(
    make_database: Any, server_url: str
) -> None:
    from roles.infra.db import migrate_url

    url = make_database()
    await migrate_url(url)
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        url, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False, timeout=0.5
    )
    await pool.open(wait=True)
    store = Store(pool, policies=assembly.POLICIES)
    try:
        async with api_client(url, store=store) as client:
            job = (await post(client, enqueue_body())).json()["job"]
            async with await psycopg.AsyncConnection.connect(server_url, autocommit=True) as admin:
                await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'.encode())
                await admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                    (name,),
                )
                try:
                    for response in (
                        await client.get(f"/jobs/{job['jobId']}", headers=AS_A),
                        await client.get("/jobs", headers=AS_A),
                        await client.get(f"/jobs/{job['jobId']}/events", headers=AS_A),
                        await post(client, enqueue_body()),
                        await client.post(
                            f"/jobs/{job['jobId']}/commands", json={"type": "abort"}, headers=AS_A
                        ),
                        await client.get("/readyz"),
                    ):
                        assert_error(response, 503, "storage_unavailable")
                        assert int(response.headers["retry-after"]) > 0
                    assert (await client.get("/healthz")).status_code == 200
                finally:
                    await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'.encode())
            # The pool reconnects with its own backoff; the API recovers without a restart.
            for _ in range(100):
                if (await client.get("/readyz")).status_code == 200:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the API did not recover after the outage")
            assert (await client.get(f"/jobs/{job['jobId']}", headers=AS_A)).status_code == 200
    finally:
        await store.close()


# --- running open -----------------------------------------------------------------------------


async def test_without_tokens_the_api_runs_open_on_loopback_and_warns(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="roles.api.app"):
        async with api_client(
            db_url, tokens=None, host="127.0.0.1", base_url="http://127.0.0.1:8000"
        ) as client:
            response = await post(client, enqueue_body(org="org-q"), headers={})
            assert response.status_code == 202
            job_id = response.json()["job"]["jobId"]
            assert (await client.get(f"/jobs/{job_id}")).status_code == 200
    assert any("no API tokens configured" in r.getMessage() for r in caplog.records)


def test_without_tokens_the_api_refuses_a_non_loopback_bind() -> None:
    from roles.api.app import create_app
    from roles.api.auth import TokenConfigError
    from roles.api.settings import ApiSettings
    from roles.infra.settings import RuntimeSettings

    def app(**api: str) -> None:
        create_app(RuntimeSettings(api=ApiSettings(**api)))

    for host in ("0.0.0.0", "10.1.2.3", "::", "api.example.com"):
        with pytest.raises(TokenConfigError, match="refusing to serve"):
            app(host=host)
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        app(host=host)
    app(host="0.0.0.0", tokens="t org")


async def test_error_bodies_are_json_objects(client: httpx.AsyncClient) -> None:
    response = await client.get("/jobs/nope", headers=AS_A)
    assert json.loads(response.content) == response.json()


def test_the_documented_enumerations_are_the_domain_ones() -> None:
    from typing import get_args

    from receipts.jobs import COMMAND_TYPES
    from roles.api.schema import CommandTypeName, KindName, LaneName, SingletonModeName

    assert get_args(LaneName) == LANES
    assert get_args(SingletonModeName) == SINGLETON_MODES
    assert get_args(CommandTypeName) == COMMAND_TYPES
    assert get_args(KindName) == KINDS
