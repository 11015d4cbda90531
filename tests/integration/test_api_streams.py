"""Every kind of event stream keeps the same rules (README, Security), from a real `receipt api`
process on real PostgreSQL: a job's, an owner session's, an objective's and an agent job's
stream are each capped per token (429 beyond), end after the maximum lifetime (sending
keepalives until then), refuse a malformed `Last-Event-ID` naming the header, and resume
after a valid one."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from receipts import operations as ops
from receipts.agent_jobs import lifecycle
from receipts.agent_jobs.registry import AgentJobSettings
from receipts.store import Store
from receipts.tenancy import scoped_id
from roles.delivery.agent_jobs import AgentJobDispatcher
from tests.integration.api_support import (
    AS_A,
    AS_ADMIN,
    ROOT,
    TOKEN_A,
    TOKENS,
    RunningApi,
    clean_env,
    enqueue_body,
    events,
    rid,
    running_api,
)
from tests.integration.factory.test_outbox_and_watchdog import TASK, create_objective

PER_TOKEN = 3
LIFETIME_S = 1.5
KINDS = ("jobs", "sessions", "objectives", "agent-jobs")
# One token per kind for the cap tests, so that no other test's streams (still closing) count.
CAP_TOKENS = {kind: f"token-streams-{kind}-0123456789abcdef" for kind in KINDS}
STREAM = {"Accept": "text/event-stream"}


@pytest.fixture(scope="module")
def api(db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    tokens = TOKENS + "".join(f"\n{token} org-a" for token in CAP_TOKENS.values())
    with running_api(
        db_url,
        Path(tmp_path_factory.mktemp("api-streams")),
        RECEIPT_API_TOKENS=tokens,
        RECEIPT_SSE_MAX_STREAMS_PER_CALLER=str(PER_TOKEN),
        RECEIPT_SSE_MAX_LIFETIME_S=str(LIFETIME_S),
        RECEIPT_SSE_KEEPALIVE_MS="200",
    ) as api:
        yield api


@pytest.fixture
async def http(api: RunningApi) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api.url, timeout=30) as client:
        yield client


# --- one followed thing of each kind, of org-a, with two receipts and not finished -----------


async def new_agent_job(http: httpx.AsyncClient, session: str) -> str:
    body = {
        "agentId": f"agent-{uuid.uuid4().hex[:6]}",
        "ownerSessionId": session,
        "sourceActorEventId": "event-1",
        "sourceToolCallId": f"tool-{uuid.uuid4().hex[:8]}",
        "replyRoute": {"binding": "slack", "channel": "C1"},
        "input": {"prompt": "summarise the repo"},
    }
    response = await http.post("/agent-jobs", json=body, headers=AS_A)
    assert response.status_code == 201, response.text
    agent_job_id: str = response.json()["agentJob"]["agentJobId"]
    return agent_job_id


async def a_job(http: httpx.AsyncClient, store: Store) -> str:
    response = await http.post("/agents/codex/jobs", json=enqueue_body(), headers=AS_A)
    assert response.status_code == 202, response.text
    job_id: str = response.json()["job"]["jobId"]
    leased = await ops.lease(
        store, rid(job_id), attempt=1, worker_id=f"{job_id}:attempt:1/1", lease_ms=600_000
    )
    assert leased.ok  # seq 2: job.leased; the job stays running
    return f"/jobs/{job_id}/events"


async def a_session(http: httpx.AsyncClient, store: Store) -> str:
    """An owner session with two wakeups: two of its agent jobs ran a turn and succeeded."""
    session = f"session-{uuid.uuid4().hex[:8]}"
    agent_job_ids = [await new_agent_job(http, session) for _ in range(2)]
    dispatcher = AgentJobDispatcher(store, None, AgentJobSettings())
    await dispatcher.run_once()
    for agent_job_id in agent_job_ids:
        running = await lifecycle.get(store, agent_job_id)
        assert running is not None and running.queue_job_id is not None
        queue_job_id = running.queue_job_id
        worker = f"{queue_job_id}:attempt:1/1"
        started = await ops.start_attempt(
            store, queue_job_id, attempt=1, worker_id=worker, lease_ms=60_000
        )
        assert started.ok
        done = await ops.complete(
            store, queue_job_id, worker_id=worker, attempt=1, result={"outcome": "done"}
        )
        assert done.ok
    await dispatcher.run_once()
    assert len(await store.read_stream(f"sessions/{scoped_id('org-a', session)}")) == 2
    return f"/sessions/{session}/events"


async def an_objective(http: httpx.AsyncClient, store: Store) -> str:
    objective_id = f"streams-{uuid.uuid4().hex[:8]}"
    await create_objective(store, objective_id, TASK)
    # seq 2: objective.cancel_requested (no control role runs here: it stays active).
    canceled = await http.post(f"/objectives/{objective_id}/cancel", headers=AS_A)
    assert canceled.status_code == 202, canceled.text
    return f"/objectives/{objective_id}/events"


async def an_agent_job(http: httpx.AsyncClient, store: Store) -> str:
    agent_job_id = await new_agent_job(http, f"session-{uuid.uuid4().hex[:8]}")
    await AgentJobDispatcher(store, None, AgentJobSettings()).run_once()  # claimed: running
    assert len(await store.read_stream(f"agent-jobs/{agent_job_id}")) >= 2
    return f"/agent-jobs/{agent_job_id}/events"


MAKERS: dict[str, Callable[[httpx.AsyncClient, Store], Awaitable[str]]] = {
    "jobs": a_job,
    "sessions": a_session,
    "objectives": an_objective,
    "agent-jobs": an_agent_job,
}


async def opened(http: httpx.AsyncClient, path: str, headers: dict[str, str]) -> int:
    """The status a stream opens with (it is closed at once)."""
    async with http.stream("GET", path, headers=headers) as response:
        return response.status_code


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code and error["message"]
    return error


# --- the rules, for each kind ----------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_open_streams_are_capped_per_token(
    http: httpx.AsyncClient, store: Store, kind: str
) -> None:
    path = await MAKERS[kind](http, store)
    mine = {"Authorization": f"Bearer {CAP_TOKENS[kind]}", **STREAM}
    async with (
        http.stream("GET", path, headers=mine) as one,
        http.stream("GET", path, headers=mine) as two,
        http.stream("GET", path, headers=mine) as three,
    ):
        assert [r.status_code for r in (one, two, three)] == [200] * PER_TOKEN
        async with http.stream("GET", path, headers=mine) as refused:
            assert refused.status_code == 429  # (an uncapped stream would never end)
            await refused.aread()
        error = assert_error(refused, 429, "too_many_requests")
        assert "RECEIPT_SSE_MAX_STREAMS_PER_CALLER" in error["message"]
        assert int(refused.headers["retry-after"]) >= 1
        # Another token is not held back by this one's streams.
        async with http.stream("GET", path, headers={**AS_ADMIN, **STREAM}) as theirs:
            assert theirs.status_code == 200
    # The slots come back once the streams are closed.
    deadline = time.monotonic() + 10
    while await opened(http, path, mine) == 429:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_stream_sends_keepalives_and_ends_at_its_maximum_lifetime(
    http: httpx.AsyncClient, store: Store, kind: str
) -> None:
    path = await MAKERS[kind](http, store)
    started = time.monotonic()
    async with http.stream("GET", path, headers={**AS_A, **STREAM}) as response:
        assert response.status_code == 200
        text = (await asyncio.wait_for(response.aread(), 20)).decode()
    elapsed = time.monotonic() - started
    # Nothing finished the followed thing: the stream closed because its lifetime ran out.
    assert "event: end" not in text and "id: 1\n" in text and "id: 2\n" in text
    assert ": keepalive" in text
    assert LIFETIME_S * 0.9 <= elapsed < 15, elapsed


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("value", ["seven", "9" * 5000, "9" * 19, "-1", "1.5"])
async def test_a_malformed_last_event_id_is_refused_naming_the_header(
    http: httpx.AsyncClient, store: Store, kind: str, value: str
) -> None:
    path = await MAKERS[kind](http, store)
    for accept in (STREAM, {}):
        response = await http.get(path, headers={**AS_A, **accept, "Last-Event-ID": value})
        error = assert_error(response, 422, "invalid_input")
        assert error["field"] == "Last-Event-ID" and "Last-Event-ID" in error["message"]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_resumed_stream_continues_after_the_given_id(
    http: httpx.AsyncClient, store: Store, kind: str
) -> None:
    path = await MAKERS[kind](http, store)
    stored = (await http.get(path, headers=AS_A)).json()["receipts"]
    assert len(stored) >= 2
    headers = {**AS_A, **STREAM, "Last-Event-ID": "1"}
    received: list[dict[str, Any]] = []
    async with http.stream("GET", path, headers=headers, params={"after": 0}) as response:
        async for event in events(response):
            assert event.name == "message", event
            receipt = json.loads(event.data)
            assert event.id == str(receipt["seq"])
            received.append(receipt)
            if len(received) == len(stored) - 1:
                break
    assert [r["seq"] for r in received] == [r["seq"] for r in stored[1:]]
    assert [r["type"] for r in received] == [r["type"] for r in stored[1:]]
    # The JSON page resumes the same way.
    page = (await http.get(path, headers={**AS_A, "Last-Event-ID": "1"})).json()
    assert [r["seq"] for r in page["receipts"]] == [r["seq"] for r in stored[1:]]


async def test_an_agent_job_stream_ends_once_the_job_is_stopped(
    http: httpx.AsyncClient, store: Store
) -> None:
    agent_job_id = await new_agent_job(http, f"session-{uuid.uuid4().hex[:8]}")
    received: list[str] = []
    end: dict[str, Any] | None = None

    async def follow() -> None:
        nonlocal end
        path = f"/agent-jobs/{agent_job_id}/events"
        async with http.stream("GET", path, headers={**AS_A, **STREAM}) as response:
            async for event in events(response):
                if event.name == "end":
                    end = json.loads(event.data)
                    return
                received.append(json.loads(event.data)["type"])

    following = asyncio.create_task(follow())
    await asyncio.sleep(0.3)  # live before the job is stopped
    stopped = await http.post(f"/console/agent-jobs/{agent_job_id}/cancel", headers=AS_ADMIN)
    assert stopped.status_code == 202 and stopped.json()["agentJob"]["status"] == "stopped"
    await asyncio.wait_for(following, 10)
    assert end == {"agentJobId": agent_job_id, "status": "stopped"}
    stored = await store.read_stream(f"agent-jobs/{agent_job_id}")
    assert received == [r.type for r in stored]


async def test_the_cli_prints_an_objectives_receipts_page_after_page(
    api: RunningApi, http: httpx.AsyncClient, store: Store
) -> None:
    path = await an_objective(http, store)
    objective_id = path.split("/")[2]
    stored = await store.read_stream(f"objectives/{objective_id}")
    cli = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "roles.cli.main", "objectives", "events", objective_id, "--json"),
        cwd=ROOT,
        env=clean_env({"RECEIPT_API_URL": api.url, "RECEIPT_API_TOKEN": TOKEN_A}),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(cli.communicate(), 60)
    assert cli.returncode == 0, err.decode()
    seqs = [json.loads(line)["seq"] for line in out.decode().splitlines()]
    assert seqs[: len(stored)] == [r.seq for r in stored]
    assert seqs == list(range(1, len(seqs) + 1))


async def test_a_console_stream_ends_when_its_session_is_signed_out(
    api: RunningApi, store: Store
) -> None:
    """The session was checked once, when the stream opened: a stream opened with a cookie
    (a stolen copy too) went on past sign-out, receiving what the job appended, until its
    lifetime ran out. Now what arrives after sign-out is not sent: the stream ends."""
    async with httpx.AsyncClient(base_url=api.url, timeout=30) as console:
        signed_in = await console.post(
            "/console/login",
            content=f"token={TOKEN_A}",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert signed_in.status_code == 303, signed_in.text
        path = await a_job(console, store)  # seq 1 enqueued, seq 2 leased
        job_id = path.split("/")[2]
        page = await console.get(f"/console/jobs/{job_id}")
        csrf = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        seqs: list[str] = []
        async with console.stream("GET", f"/console/jobs/{job_id}/events", headers=STREAM) as live:
            received = events(live)
            while "2" not in seqs:
                seqs.append((await asyncio.wait_for(anext(received), 20)).id or "")
            signed_out = await console.post(
                "/console/logout",
                content=f"csrf={csrf}",
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            )
            assert signed_out.status_code == 303
            worker = f"{job_id}:attempt:1/1"
            progressed = await ops.progress(
                store, rid(job_id), worker_id=worker, attempt=1, data={"lines": ["after"]}
            )
            assert progressed.ok

            async def the_rest() -> list[str]:
                return [event.id or "" async for event in received]

            rest = await asyncio.wait_for(the_rest(), 20)
    assert seqs == ["1", "2"]
    assert rest == [], rest  # seq 3, the progress after sign-out, was not sent
