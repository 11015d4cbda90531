"""receipt-client's `wait(timeout=…)` over httpx's mock transport: a job whose stream keeps
sending (progress every 0.2 s) still gives up at its deadline, in both clients; a wait on an
objective reads no history it need not."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime

import httpx
import pytest
from fastapi.encoders import jsonable_encoder

from receipt_client import AsyncClient, Client, WaitTimedOut
from receipts.jobs import Job
from roles.api.schema import job_view

EVENT_STREAM = {"content-type": "text/event-stream"}
RUNS_S = 8.0  # how long the job keeps sending progress before it ends


def running_job() -> dict[str, object]:
    now = datetime.now(UTC)
    job = Job(
        job_id="j-1",
        agent_id="codex",
        lane="collect",
        kind="factory.task.run",
        payload={"kind": "factory.task.run"},
        status="running",
        created_at=now,
        updated_at=now,
    )
    return jsonable_encoder(job_view(job))


def progress(seq: int) -> bytes:
    return f'id: {seq}\ndata: {{"seq": {seq}, "type": "job.progress"}}\n\n'.encode()


def chatty() -> Iterator[bytes]:
    ends = time.monotonic() + RUNS_S
    seq = 0
    while time.monotonic() < ends:
        seq += 1
        yield progress(seq)
        time.sleep(0.2)
    yield b'event: end\ndata: {"status": "completed"}\n\n'


async def chatty_async() -> AsyncIterator[bytes]:
    ends = time.monotonic() + RUNS_S
    seq = 0
    while time.monotonic() < ends:
        seq += 1
        yield progress(seq)
        await asyncio.sleep(0.2)
    yield b'event: end\ndata: {"status": "completed"}\n\n'


def test_a_wait_on_a_job_that_keeps_sending_gives_up_at_its_timeout() -> None:
    """Each receipt reset the read timeout, and a read of 1 s (SLACK_S) was never cut: `wait(j,
    timeout=1)` of a job streaming its output every 0.2 s ran until the job ended (8 s here,
    hours for a long job) instead of raising `WaitTimedOut` about a second past its deadline."""
    view = running_job()

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            return httpx.Response(200, content=chatty(), headers=EVENT_STREAM)
        return httpx.Response(200, json=view)

    started = time.monotonic()
    with Client("http://api", "t", transport=httpx.MockTransport(answer)) as client:
        with pytest.raises(WaitTimedOut, match="job j-1 did not end in time"):
            client.wait("j-1", timeout=1)
    assert time.monotonic() - started < 3.5


async def test_the_async_client_s_wait_gives_up_at_its_timeout_too() -> None:
    view = running_job()

    async def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            return httpx.Response(200, content=chatty_async(), headers=EVENT_STREAM)
        return httpx.Response(200, json=view)

    started = time.monotonic()
    async with AsyncClient("http://api", "t", transport=httpx.MockTransport(answer)) as client:
        with pytest.raises(WaitTimedOut, match="job j-1 did not end in time"):
            await client.wait("j-1", timeout=1)
    assert time.monotonic() - started < 3.5


def test_a_wait_reads_the_job_first_and_follows_from_where_it_is() -> None:
    """A terminal job is answered at once, its history not read (a wait of 0 on a job of many
    receipts read them all, and could time out doing it); a running one is followed from its
    own seq, not from 0."""
    ended = {**running_job(), "status": "completed", "seq": 5000}
    running = {**running_job(), "seq": 41}
    asked_from: list[str] = []

    def answer_for(view: dict[str, object]) -> httpx.MockTransport:
        def answer(request: httpx.Request) -> httpx.Response:
            if request.url.path.endswith("/events"):
                asked_from.append(request.headers["last-event-id"])
                body = progress(42) + b'event: end\ndata: {"status": "completed"}\n\n'
                view["status"], view["seq"] = "completed", 43
                return httpx.Response(200, content=body, headers=EVENT_STREAM)
            return httpx.Response(200, json=view)

        return httpx.MockTransport(answer)

    with Client("http://api", "t", transport=answer_for(ended)) as client:
        assert client.wait("j-1", timeout=0).status == "completed"
    assert asked_from == []
    with Client("http://api", "t", transport=answer_for(running)) as client:
        assert client.wait("j-1", timeout=5).status == "completed"
    assert asked_from == ["41"]


def objective(status: str, seq: int, **fields: object) -> dict[str, object]:
    now = datetime.now(UTC).isoformat()
    return {
        "objectiveId": "o-1",
        "organizationId": "org",
        "authContext": {},
        "goal": "g",
        "title": "t",
        "stream": "objective:o-1",
        "createdAt": now,
        "updatedAt": now,
        "status": status,
        "seq": seq,
        **fields,
    }


@pytest.mark.parametrize(
    "ended",
    [
        objective("completed", 900, auditJobId="a-1", audit={"verdict": "ok"}),
        objective("canceled", 900),  # settled with no audit owed
    ],
)
def test_a_wait_on_an_objective_that_has_ended_reads_no_history(ended: dict[str, object]) -> None:
    """`wait_objective` read the objective's stream from 0 every time: an objective of many tasks
    already settled and audited streamed its whole history before the answer (and a wait of 0
    could time out reading it)."""
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return httpx.Response(200, json=ended)

    with Client("http://api", "t", transport=httpx.MockTransport(answer)) as client:
        assert client.wait_objective("o-1", timeout=0).status == ended["status"]
    assert asked == ["/objectives/o-1"]


async def test_a_wait_on_an_objective_follows_it_from_its_own_seq() -> None:
    """Settled but its audit still owed: not ended, so followed — from its seq, not from 0."""
    view = objective("completed", 77, auditJobId="a-1")
    asked_from: list[str] = []

    async def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            asked_from.append(request.headers["last-event-id"])
            view["audit"], view["seq"] = {"verdict": "ok"}, 78
            body = progress(78) + b'event: end\ndata: {"status": "completed"}\n\n'
            return httpx.Response(200, content=body, headers=EVENT_STREAM)
        return httpx.Response(200, json=view)

    async with AsyncClient("http://api", "t", transport=httpx.MockTransport(answer)) as client:
        found = await client.wait_objective("o-1", timeout=5)
    assert found.audit == {"verdict": "ok"} and asked_from == ["77"]
