"""The agent-job and session routes: validation, organizations, the console, session events."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from receipt_client.sse import parse_sse
from receipts import operations as ops
from receipts.agent_jobs import claims, lifecycle
from receipts.agent_jobs.registry import AgentJobSettings
from receipts.store import Store
from receipts.tenancy import scoped_id
from roles.delivery.agent_jobs import AgentJobDispatcher
from tests.integration.api_support import (
    AS_A,
    AS_ADMIN,
    AS_B,
    RunningApi,
    api_client,
    conforms,
    running_api,
)


def body(**extra: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "agentId": f"agent-{uuid.uuid4().hex[:6]}",
        "ownerSessionId": f"session-{uuid.uuid4().hex[:8]}",
        "sourceActorEventId": "event-1",
        "sourceToolCallId": f"tool-{uuid.uuid4().hex[:8]}",
        "replyRoute": {"binding": "slack", "channel": "C1", "thread": "T1"},
        "input": {"prompt": "summarise the repo"},
    }
    values.update(extra)
    return values


@pytest.fixture(scope="module")
async def client(db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(db_url) as client:
        yield client


async def create(
    client: httpx.AsyncClient, headers: dict[str, str], **extra: Any
) -> dict[str, Any]:
    response = await client.post("/agent-jobs", json=body(**extra), headers=headers)
    assert response.status_code == 201, response.text
    job: dict[str, Any] = response.json()["agentJob"]
    return job


async def test_create_shows_the_job_and_a_retry_returns_it(client: httpx.AsyncClient) -> None:
    sent = body()
    first = await client.post("/agent-jobs", json=sent, headers=AS_A)
    assert first.status_code == 201
    job = first.json()["agentJob"]
    assert (job["status"], job["organizationId"], job["attempt"], job["turn"]) == (
        "queued",
        "org-a",
        0,
        0,
    )
    assert job["replyRoute"] == sent["replyRoute"]
    assert job["latestStatus"] == {"state": "queued", "errorCode": None, "pendingToolCall": None}
    again = await client.post("/agent-jobs", json=sent, headers=AS_A)
    assert again.status_code == 200 and again.json()["agentJob"]["agentJobId"] == job["agentJobId"]
    shown = await client.get(f"/agent-jobs/{job['agentJobId']}", headers=AS_A)
    assert shown.status_code == 200 and shown.json()["stream"] == f"agent-jobs/{job['agentJobId']}"


async def test_a_job_records_the_turn_it_was_handed_off_from(
    client: httpx.AsyncClient, store: Store
) -> None:
    """B2: the owner session, the source actor event and the source tool call are recorded (in
    the created receipt) and shown, so the hand-off stays reconstructable."""
    sent = body(sourceActorEventId=f"event-{uuid.uuid4().hex[:8]}")
    job = (await client.post("/agent-jobs", json=sent, headers=AS_A)).json()["agentJob"]
    shown = (await client.get(f"/agent-jobs/{job['agentJobId']}", headers=AS_A)).json()
    handed = (sent["ownerSessionId"], sent["sourceActorEventId"], sent["sourceToolCallId"])
    for view in (job, shown):
        assert (view["ownerSessionId"], view["sourceActorEventId"], view["sourceToolCallId"]) == (
            handed
        )
    [created] = await store.read_stream(f"agent-jobs/{job['agentJobId']}")
    assert created.data["sourceActorEventId"] == sent["sourceActorEventId"]
    assert created.data["sourceToolCallId"] == sent["sourceToolCallId"]


async def test_a_session_link_reaches_a_session_whose_id_is_a_dot_segment(
    client: httpx.AsyncClient,
) -> None:
    """`ownerSessionId` may be `..`: the view's `sessionEvents` link still names that session
    once a client resolves it (left bare, `/sessions/../events` is `/events`)."""
    job = await create(client, AS_B, ownerSessionId="..")
    link = job["links"]["sessionEvents"]
    events = await client.get(link, headers=AS_B)
    assert events.status_code == 200, (link, events.text)
    assert events.json()["sessionId"] == ".."
    listed = await client.get(link.removesuffix("/events") + "/agent-jobs", headers=AS_B)
    assert job["agentJobId"] in [j["agentJobId"] for j in listed.json()["agentJobs"]]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"agentId": ""}, "agentId"),
        ({"ownerSessionId": None}, "ownerSessionId"),
        ({"ownerSessionId": "s~0123456789abcdef"}, "ownerSessionId"),  # the runtime's form
        ({"replyRoute": {"binding": "slack"}}, "replyRoute.channel"),
        ({"input": {"prompt": "a", "command": ["b"]}}, "input"),
        ({"input": {"command": "not a list"}}, "input.command"),
        ({"input": {"script": "x"}}, "input.script"),
        ({"surprise": 1}, "surprise"),
        ({"continuedFromJobId": "no-such-job"}, "continuedFromJobId"),
    ],
)
async def test_bad_input_names_the_field_and_writes_nothing(
    client: httpx.AsyncClient, store: Store, change: dict[str, Any], field: str
) -> None:
    sent = body(**change)
    response = await client.post("/agent-jobs", json=sent, headers=AS_A)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field
    # Nothing written: not even the owner session.
    listed = await client.get(f"/sessions/{sent['ownerSessionId']}/agent-jobs", headers=AS_A)
    assert listed.status_code in (404, 422)


async def test_another_organization_cannot_see_answer_or_take_a_session(
    client: httpx.AsyncClient, store: Store
) -> None:
    """Owner session ids are scoped by organization as job ids are: another organization naming
    the same id gets a session of its own, so it can neither take one nor learn it exists."""
    job = await create(client, AS_A)
    agent_job_id, session = job["agentJobId"], job["ownerSessionId"]
    for path in (f"/agent-jobs/{agent_job_id}", f"/agent-jobs/{agent_job_id}/events"):
        assert (await client.get(path, headers=AS_B)).status_code == 404
    answer = await client.post(
        f"/agent-jobs/{agent_job_id}/input", json={"answer": "x"}, headers=AS_B
    )
    assert answer.status_code == 404
    assert (await client.get(f"/sessions/{session}/events", headers=AS_B)).status_code == 404
    assert (await client.get(f"/sessions/{session}/events", headers=AS_A)).status_code == 200
    assert (await client.get(f"/sessions/{session}/agent-jobs", headers=AS_B)).status_code == 404
    listed = (await client.get(f"/sessions/{session}/agent-jobs", headers=AS_A)).json()
    assert [j["agentJobId"] for j in listed["agentJobs"]] == [agent_job_id]
    own = await client.post("/agent-jobs", json=body(ownerSessionId=session), headers=AS_B)
    assert own.status_code == 201, own.text
    assert own.json()["agentJob"]["ownerSessionId"] == session
    theirs = (await client.get(f"/sessions/{session}/agent-jobs", headers=AS_B)).json()
    assert [j["agentJobId"] for j in theirs["agentJobs"]] == [own.json()["agentJob"]["agentJobId"]]
    listed = (await client.get(f"/sessions/{session}/agent-jobs", headers=AS_A)).json()
    assert [j["agentJobId"] for j in listed["agentJobs"]] == [agent_job_id]
    # Each sees its session by the id it chose; the runtime holds two.
    shown = (await client.get(f"/agent-jobs/{agent_job_id}", headers=AS_A)).json()
    assert shown["ownerSessionId"] == session and "~" not in shown["sessionStream"]
    stored = await lifecycle.get(store, agent_job_id)
    assert stored is not None and stored.owner_session_id == scoped_id("org-a", session)
    forged = await client.post("/agent-jobs", json=body(organizationId="org-a"), headers=AS_B)
    assert forged.status_code == 403
    # An admin names runtime ids, or an organization's own id while one organization has it.
    both = await client.get(f"/sessions/{session}/events", headers=AS_ADMIN)
    assert both.status_code == 409 and both.json()["error"]["code"] == "ambiguous_session_id"
    runtime = scoped_id("org-a", session)
    assert (await client.get(f"/sessions/{runtime}/events", headers=AS_ADMIN)).status_code == 200
    alone = (await create(client, AS_A))["ownerSessionId"]
    assert (await client.get(f"/sessions/{alone}/agent-jobs", headers=AS_ADMIN)).status_code == 200


async def test_only_admin_tokens_reach_the_console(client: httpx.AsyncClient) -> None:
    job = await create(client, AS_A)
    agent_job_id = job["agentJobId"]
    for headers in (AS_A, AS_B):
        assert (await client.get("/console/agent-jobs", headers=headers)).status_code == 403
        assert (
            await client.get(f"/console/agent-jobs/{agent_job_id}", headers=headers)
        ).status_code == 403
        assert (
            await client.post(f"/console/agent-jobs/{agent_job_id}/cancel", headers=headers)
        ).status_code == 403
    assert (await client.get("/console/agent-jobs")).status_code == 401
    listed = await client.get(
        "/console/agent-jobs", params={"organizationId": "org-a", "limit": 1}, headers=AS_ADMIN
    )
    assert listed.status_code == 200 and len(listed.json()["agentJobs"]) == 1
    assert listed.json()["nextCursor"]
    shown = await client.get(f"/console/agent-jobs/{agent_job_id}", headers=AS_ADMIN)
    assert shown.status_code == 200
    assert [r["type"] for r in shown.json()["receipts"]] == ["agent_job.created"]
    canceled = await client.post(
        f"/console/agent-jobs/{agent_job_id}/cancel",
        json={"reason": "no longer needed"},
        headers=AS_ADMIN,
    )
    assert canceled.status_code == 202 and canceled.json()["agentJob"]["status"] == "stopped"
    again = await client.post(f"/console/agent-jobs/{agent_job_id}/cancel", headers=AS_ADMIN)
    assert again.status_code == 409


async def test_the_agent_job_routes_answer_as_their_schemas_say(client: httpx.AsyncClient) -> None:
    sent = body()
    created = await client.post("/agent-jobs", json=sent, headers=AS_A)
    assert created.status_code == 201, created.text
    conforms(created, "/agent-jobs", "post")
    again = await client.post("/agent-jobs", json=sent, headers=AS_A)
    assert again.status_code == 200
    conforms(again, "/agent-jobs", "post")
    job = created.json()["agentJob"]
    shown = await client.get(f"/agent-jobs/{job['agentJobId']}", headers=AS_A)
    conforms(shown, "/agent-jobs/{agentJobId}", "get")
    session = await client.get(f"/sessions/{sent['ownerSessionId']}/agent-jobs", headers=AS_A)
    conforms(session, "/sessions/{sessionId}/agent-jobs", "get")
    events = await client.get(f"/agent-jobs/{job['agentJobId']}/events", headers=AS_A)
    assert events.json()["receipts"], events.text
    conforms(events, "/agent-jobs/{agentJobId}/events", "get")
    wakeups = await client.get(f"/sessions/{sent['ownerSessionId']}/events", headers=AS_A)
    assert wakeups.status_code == 200, wakeups.text
    conforms(wakeups, "/sessions/{sessionId}/events", "get")
    listed = await client.get(
        "/console/agent-jobs", params={"organizationId": "org-a", "limit": 2}, headers=AS_ADMIN
    )
    conforms(listed, "/console/agent-jobs", "get")
    detail = await client.get(f"/console/agent-jobs/{job['agentJobId']}", headers=AS_ADMIN)
    assert detail.status_code == 200, detail.text
    conforms(detail, "/console/agent-jobs/{agentJobId}", "get")
    canceled = await client.post(
        f"/console/agent-jobs/{job['agentJobId']}/cancel", json={}, headers=AS_ADMIN
    )
    assert canceled.status_code == 202, canceled.text
    conforms(canceled, "/console/agent-jobs/{agentJobId}/cancel", "post")


async def test_answering_a_job_that_does_not_wait_is_a_conflict(client: httpx.AsyncClient) -> None:
    job = await create(client, AS_A)
    response = await client.post(
        f"/agent-jobs/{job['agentJobId']}/input", json={"answer": "x"}, headers=AS_A
    )
    assert response.status_code == 409 and response.json()["error"]["code"] == "not_waiting"
    missing = await client.post(f"/agent-jobs/{job['agentJobId']}/input", json={}, headers=AS_A)
    assert missing.status_code == 422 and missing.json()["error"]["field"] == "answer"


async def test_a_continuation_of_an_unfinished_job_is_409_live_turn_running(
    client: httpx.AsyncClient,
) -> None:
    """README, *Background agent jobs*: a `continuedFromJobId` is taken only once every job of
    that workspace has finished: else 409 `live_turn_running` naming the field, nothing
    written; once it is finished, the continuation is created in its workspace."""
    first = await create(client, AS_A)
    sent = body(agentId=first["agentId"], continuedFromJobId=first["agentJobId"])
    refused = await client.post("/agent-jobs", json=sent, headers=AS_A)
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["field"]) == ("live_turn_running", "continuedFromJobId")
    listed = await client.get(f"/sessions/{sent['ownerSessionId']}/agent-jobs", headers=AS_A)
    assert listed.status_code == 404  # nothing written, not even the owner session
    stopped = await client.post(f"/agent-jobs/{first['agentJobId']}/cancel", headers=AS_A)
    assert stopped.status_code == 202
    taken = await client.post("/agent-jobs", json=sent, headers=AS_A)
    assert taken.status_code == 201, taken.text
    job = taken.json()["agentJob"]
    assert (job["continuedFromJobId"], job["workspaceOwnerJobId"]) == (
        first["agentJobId"],
        first["workspaceOwnerJobId"],
    )


async def test_a_steer_to_the_live_turn_of_a_stopped_job_is_409_agent_job_not_running(
    client: httpx.AsyncClient, store: Store
) -> None:
    """README, *Errors*: 409 `agent_job_not_running` for a steer or follow-up to the turn of an
    agent job that no longer runs on it (a cancel leaves its live turn to end on its own); the
    abort is still taken (it stops any job), and nothing else is written to the turn."""
    job = await create(client, AS_A)
    claimed = await claims.claim_attempt(store, job["agentJobId"], job["agentId"])
    assert not isinstance(claimed, str) and claimed.queue_job_id, claimed
    turn = claimed.queue_job_id
    worker = f"{turn}:attempt:1/1"
    started = await ops.start_attempt(store, turn, attempt=1, worker_id=worker, lease_ms=60_000)
    assert started.ok, started.status
    stopped = await client.post(f"/agent-jobs/{job['agentJobId']}/cancel", headers=AS_A)
    assert stopped.status_code == 202 and stopped.json()["agentJob"]["status"] == "stopped"
    before = await store.read_stream(f"jobs/{turn}")
    for kind in ("steer", "follow_up"):
        refused = await client.post(
            f"/jobs/{turn}/commands", json={"type": kind, "payload": "late"}, headers=AS_A
        )
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "agent_job_not_running"
    assert await store.read_stream(f"jobs/{turn}") == before
    aborted = await client.post(f"/jobs/{turn}/commands", json={"type": "abort"}, headers=AS_A)
    assert aborted.status_code == 202, aborted.text


async def test_follow_ups_an_agent_job_holds_for_its_next_turn_are_capped_across_failing_turns(
    client: httpx.AsyncClient, store: Store
) -> None:
    """README, *Limits*: an agent job holds at most `RECEIPT_AGENT_JOB_MAX_FOLLOW_UP_BYTES`
    (1 MiB) of follow-ups for its next turn, those it carries and those sent to its running
    turn together; one past it is 422 naming `payload` and the limit. A turn that fails hands
    on what it was given with what it was sent, each failing turn more: 100 follow-ups of
    64 KiB a turn grew the job's state (its row, its receipts, every read) by 6.4 MiB a turn,
    to 32 MiB over its five failures, unbounded over quota delays."""
    job = await create(client, AS_A)
    agent_job_id = job["agentJobId"]
    cap = 1024 * 1024
    payload = "x" * 60_000  # 60 002 bytes of JSON: 17 fit in 1 MiB
    carried: list[Any] = []
    for turn_number in (1, 2):
        claimed = await claims.claim_attempt(store, agent_job_id, job["agentId"])
        assert not isinstance(claimed, str) and claimed.queue_job_id, claimed
        turn = claimed.queue_job_id
        worker = f"{turn}:attempt:1/1"
        started = await ops.start_attempt(store, turn, attempt=1, worker_id=worker, lease_ms=60_000)
        assert started.ok, started.status
        taken = 0
        while True:
            posted = await client.post(
                f"/jobs/{turn}/commands",
                json={"type": "follow_up", "payload": payload},
                headers=AS_A,
            )
            if posted.status_code != 202:
                break
            taken += 1
            assert taken <= 100, "no follow-up refused"
        assert posted.status_code == 422, posted.text
        error = posted.json()["error"]
        assert error["field"] == "payload", error
        assert str(cap) in error["message"], error
        assert "RECEIPT_AGENT_JOB_MAX_FOLLOW_UP_BYTES" in error["message"], error
        # The first turn takes 17; the second none: its job carries the first's.
        assert taken == (17 if turn_number == 1 else 0), (turn_number, taken)
        failed = await ops.fail(
            store, turn, worker_id=worker, attempt=1, error="scripted", retryable=True
        )
        assert failed.ok, failed.status
        settled = await lifecycle.settle_turn(store, agent_job_id, retry_base_ms=0)
        assert settled is not None and settled.status == "queued", settled
        carried = list(settled.follow_up or [])
        assert len(json.dumps(carried).encode()) <= cap
    assert carried == [payload] * 17


# --- the session stream, live, from a real `receipt api` process ------------------------------


@pytest.fixture(scope="module")
def api(db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    with running_api(db_url, Path(tmp_path_factory.mktemp("api"))) as api:
        yield api


async def test_session_events_stream_wakeups_live_and_resume(api: RunningApi, store: Store) -> None:
    async with httpx.AsyncClient(base_url=api.url, timeout=20) as http:
        job = await create(http, AS_A)
    session = job["ownerSessionId"]
    dispatcher = AgentJobDispatcher(store, None, AgentJobSettings())
    await dispatcher.run_once()
    running = await lifecycle.get(store, job["agentJobId"])
    assert running is not None and running.queue_job_id is not None
    worker = f"{running.queue_job_id}:attempt:1/1"
    received: list[dict[str, Any]] = []

    async def listen() -> None:
        headers = {**AS_A, "Accept": "text/event-stream"}
        async with (
            httpx.AsyncClient(base_url=api.url, timeout=20) as http,
            http.stream("GET", f"/sessions/{session}/events", headers=headers) as response,
        ):
            assert response.status_code == 200
            block: list[str] = []
            async for line in response.aiter_lines():
                block.append(line)
                if line == "":
                    for event in parse_sse(block):
                        if event.name == "message" and event.data:
                            received.append(json.loads(event.data))
                    block = []
                    if received:
                        return

    listening = asyncio.create_task(listen())
    await asyncio.sleep(0.5)  # subscribed before anything is appended
    assert (
        await ops.start_attempt(
            store, running.queue_job_id, attempt=1, worker_id=worker, lease_ms=60_000
        )
    ).ok
    assert (
        await ops.complete(
            store,
            running.queue_job_id,
            worker_id=worker,
            attempt=1,
            result={"outcome": "needs_input", "question": "ok?", "toolCallId": "c1"},
        )
    ).ok
    await dispatcher.run_once()
    await asyncio.wait_for(listening, 15)
    assert received[0]["type"] == "session.wakeup"
    assert received[0]["data"]["sourceId"] == f"{job['agentJobId']}:waiting_on_user:1:1"
    async with httpx.AsyncClient(base_url=api.url, timeout=20) as http:
        page = await http.get(f"/sessions/{session}/events", params={"after": 1}, headers=AS_A)
        assert page.json()["receipts"] == []
        view = (await http.get(f"/agent-jobs/{job['agentJobId']}", headers=AS_A)).json()
        assert view["latestStatus"]["state"] == "interrupted"
        assert view["latestStatus"]["errorCode"] == "request_user_input"
        assert view["latestStatus"]["pendingToolCall"] == {"toolCallId": "c1", "question": "ok?"}
        answered = await http.post(
            f"/agent-jobs/{job['agentJobId']}/input",
            json={"answer": "yes", "toolCallId": "c1"},
            headers=AS_A,
        )
        assert answered.status_code == 202
        shown = answered.json()["agentJob"]
        assert shown["status"] == "waiting_on_user" and shown["latestStatus"]["answered"]

    # The dispatcher continues it; the continuation succeeds; a stream resumed after seq 1
    # starts at the second wakeup.
    await dispatcher.run_once()
    continued = await lifecycle.get(store, job["agentJobId"])
    assert continued is not None and continued.queue_job_id is not None
    worker = f"{continued.queue_job_id}:attempt:1/1"
    assert (
        await ops.start_attempt(
            store, continued.queue_job_id, attempt=1, worker_id=worker, lease_ms=60_000
        )
    ).ok
    assert (
        await ops.complete(
            store, continued.queue_job_id, worker_id=worker, attempt=1, result={"outcome": "done"}
        )
    ).ok
    await dispatcher.run_once()
    headers = {**AS_A, "Accept": "text/event-stream", "Last-Event-ID": "1"}
    async with (
        httpx.AsyncClient(base_url=api.url, timeout=20) as http,
        http.stream("GET", f"/sessions/{session}/events", headers=headers) as response,
    ):
        block: list[str] = []
        first: dict[str, Any] | None = None
        async for line in response.aiter_lines():
            block.append(line)
            if line == "":
                events = [e for e in parse_sse(block) if e.name == "message" and e.data]
                block = []
                if events:
                    first = json.loads(events[0].data)
                    assert events[0].id == "2"
                    break
    assert first is not None and first["seq"] == 2
    assert first["data"]["sourceId"] == f"{job['agentJobId']}:succeeded:1:2"


async def test_a_create_saves_the_agents_binding_and_refuses_another(
    db_url: str, tmp_path: Path
) -> None:
    """A binding decides whose model keys a turn spends (the AI gateway): the job saves its
    agent's, and a create naming another is refused with nothing written."""
    registry = tmp_path / "agents.yaml"
    registry.write_text(
        "agents:\n"
        "  - {id: coder, command: [python3, x.py], providerBinding: openai-main}\n"
        "  - {id: plain, command: [python3, x.py]}\n"
    )
    settings = AgentJobSettings.model_validate({"RECEIPT_AGENTS_FILE": str(registry)})
    async with api_client(db_url, agent_jobs=settings) as client:
        saved = await create(client, AS_A, agentId="coder")
        named = await create(client, AS_A, agentId="coder", providerBinding="openai-main")
        other = await client.post(
            "/agent-jobs", json=body(agentId="coder", providerBinding="someone-elses"), headers=AS_A
        )
        none = await client.post(
            "/agent-jobs", json=body(agentId="plain", providerBinding="openai-main"), headers=AS_A
        )
        unknown = await client.post("/agent-jobs", json=body(agentId="ghost"), headers=AS_A)
    assert saved["providerBinding"] == named["providerBinding"] == "openai-main"
    assert other.status_code == 422 and other.json()["error"]["field"] == "providerBinding"
    assert other.json()["error"]["allowed"] == ["openai-main"]
    assert none.status_code == 422 and "it names none" in none.json()["error"]["message"]
    assert unknown.status_code == 422 and unknown.json()["error"]["field"] == "agentId"


async def test_a_binding_the_api_cannot_check_is_refused(db_url: str, tmp_path: Path) -> None:
    """The worker uses the binding a job saved as it is: an api that cannot read the agents
    registry must not save a tenant's own choice of whose keys its turns spend (it did). No
    registry here: 422 naming providerBinding; one configured but unreadable: 503, retry. A
    create naming none is taken (its turns use the agent's)."""
    async with api_client(db_url, agent_jobs=AgentJobSettings()) as client:
        unset = await client.post(
            "/agent-jobs", json=body(agentId="coder", providerBinding="someone-elses"), headers=AS_A
        )
        plain = await create(client, AS_A, agentId="coder")
    missing = AgentJobSettings.model_validate({"RECEIPT_AGENTS_FILE": str(tmp_path / "none.yaml")})
    async with api_client(db_url, agent_jobs=missing) as client:
        unreadable = await client.post(
            "/agent-jobs", json=body(agentId="coder", providerBinding="someone-elses"), headers=AS_A
        )
    assert unset.status_code == 422, unset.text
    assert unset.json()["error"]["field"] == "providerBinding"
    assert plain["providerBinding"] is None
    assert unreadable.status_code == 503, unreadable.text
    assert unreadable.json()["error"]["code"] == "registry_unavailable"
    assert int(unreadable.headers["retry-after"]) >= 1


async def test_an_answer_sent_again_after_its_turn_started_is_answered_as_it_stands(
    client: httpx.AsyncClient, store: Store
) -> None:
    """A client that lost the reply to its answer sends it again: once the dispatcher has
    continued the job with it, the answer is the job's all the same (202, the job as it is, no
    second answer); another answer is still refused."""
    job = await create(client, AS_A)
    dispatcher = AgentJobDispatcher(store, None, AgentJobSettings())
    await dispatcher.run_once()
    running = await lifecycle.get(store, job["agentJobId"])
    assert running is not None and running.queue_job_id is not None
    worker = f"{running.queue_job_id}:attempt:1/1"
    turn = running.queue_job_id
    assert (await ops.start_attempt(store, turn, attempt=1, worker_id=worker, lease_ms=60_000)).ok
    asked = {"outcome": "needs_input", "question": "ok?", "toolCallId": "c1"}
    assert (await ops.complete(store, turn, worker_id=worker, attempt=1, result=asked)).ok
    await dispatcher.run_once()
    url = f"/agent-jobs/{job['agentJobId']}/input"
    answer = {"answer": "yes", "toolCallId": "c1"}
    assert (await client.post(url, json=answer, headers=AS_A)).status_code == 202
    await dispatcher.run_once()  # a slot: the job runs its next turn with the answer
    again = await client.post(url, json=answer, headers=AS_A)
    assert again.status_code == 202, again.text
    assert again.json()["agentJob"]["status"] == "running"
    without_call = await client.post(url, json={"answer": "yes"}, headers=AS_A)
    assert without_call.status_code == 202, without_call.text
    other = await client.post(url, json={"answer": "no", "toolCallId": "c1"}, headers=AS_A)
    assert other.status_code == 409 and other.json()["error"]["code"] == "not_waiting"
    events = await store.read_stream(f"agent-jobs/{job['agentJobId']}")
    assert [r.type for r in events].count("agent_job.answered") == 1
