"""receipt-client (clients/python) against a real `receipt api` process and its database: every
method of `Client` answers its model, `AsyncClient` the same, and each refusal is the exception
of its status (401, 403, 404, 409, 413, 415, 422, 429) carrying the API's code and field.

No worker runs here: the jobs are settled by an abort while queued. Jobs that run — the handler
SDK, objectives through their audit, `wait()` across an api restart — are in
tests/e2e/test_client_roles.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from receipt_client import (
    AsyncClient,
    Client,
    Conflict,
    ConnectionFailed,
    Forbidden,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    Unauthorized,
    UnsupportedMediaType,
    WaitTimedOut,
    models,
)
from receipt_client.errors import error_of
from receipt_client.sse import parse_sse
from receipts.kinds import KINDS
from tests.integration.api_support import TOKEN_A, TOKEN_ADMIN, RunningApi, running_api
from tests.integration.test_api_agent_jobs import body as agent_job_body


def task(org: str = "org-a", **task: Any) -> dict[str, Any]:
    return {
        "kind": "factory.task.run",
        "task": {"command": ["true"], **task},
        "authContext": {"userId": "u", "organizationId": org},
    }


def new_id(prefix: str = "client") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def api(db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    with running_api(db_url, Path(tmp_path_factory.mktemp("api"))) as api:
        yield api


@pytest.fixture
def client(api: RunningApi) -> Iterator[Client]:
    with Client(api.url, TOKEN_A) as client:
        yield client


def canceled_job(client: Client, **options: Any) -> str:
    """A job enqueued and aborted while queued (canceled at once: no worker runs here)."""
    job_id = new_id()
    client.enqueue("codex", task(), job_id=job_id, **options)
    client.abort(job_id, reason="not today")
    return job_id


def test_jobs_enqueue_read_list_command_and_wait(client: Client) -> None:
    job_id = new_id()
    accepted = client.enqueue("codex", task(), job_id=job_id, session_key=new_id("s"))
    assert isinstance(accepted, models.EnqueueAccepted)
    assert accepted.job.job_id == job_id and accepted.outcome == "created"
    again = client.enqueue("codex", task(), job_id=job_id)
    assert (again.outcome, again.job.job_id) == ("existing", job_id)
    keyed = client.enqueue("codex", task(), idempotency_key="build-7")
    assert client.enqueue("codex", task(), idempotency_key="build-7").job.job_id == keyed.job.job_id

    job = client.get_job(job_id)
    assert isinstance(job, models.JobView) and job.status == "queued" and job.agent_has_handler
    steered = client.steer(job_id, {"hint": "look left"})
    assert isinstance(steered, models.CommandAccepted) and steered.type == "steer"
    assert client.follow_up(job_id, {"next": 1}).type == "follow_up"
    assert [c.type for c in client.get_job(job_id).pending_commands] == ["steer", "follow_up"]

    client.abort(job_id, reason="not today")
    done = client.wait(job_id)
    assert (done.status, done.canceled_reason) == ("canceled", "not today")
    followed = [r.type for r in client.follow(job_id)]
    assert followed[0] == "job.enqueued" and followed[-1] == "job.canceled"
    assert [r.type for r in client.receipts(job_id)] == followed
    page = client.job_events(job_id, after=1, limit=2)
    assert isinstance(page, models.EventsPage) and [r.seq for r in page.receipts] == [2, 3]

    listed = client.list_jobs(agent_id="codex", limit=1)
    assert len(listed.jobs) == 1 and listed.next_cursor is not None
    assert job_id in {j.job_id for j in client.iter_jobs(status="canceled", limit=2)}
    # A listing resumed from a page's cursor goes on after it: nothing again, nothing skipped.
    every = [j.job_id for j in client.iter_jobs(agent_id="codex", limit=2)]
    resumed = [j.job_id for j in client.iter_jobs(listed.next_cursor, agent_id="codex", limit=2)]
    assert [listed.jobs[0].job_id, *resumed] == every


def test_wait_gives_up_at_its_timeout_and_the_job_goes_on(client: Client) -> None:
    job_id = new_id()
    client.enqueue("codex", task(), job_id=job_id)  # no worker here: it stays queued
    with pytest.raises(WaitTimedOut, match=f"job {job_id} did not end in time") as timed_out:
        client.wait(job_id, timeout=1.0)
    assert isinstance(timed_out.value, TimeoutError)
    assert client.get_job(job_id).status == "queued"
    with pytest.raises(WaitTimedOut):
        client.wait(job_id, timeout=0)  # still queued: it reads, then gives up
    with pytest.raises(NotFound):  # no such objective: the API's answer, not a timeout
        client.wait_objective(new_id("objective"), timeout=0)
    client.abort(job_id)
    assert client.wait(job_id, timeout=30).status == "canceled"
    assert client.wait(job_id, timeout=0).status == "canceled"  # terminal: answered at once


def test_retry_and_bulk_retry(client: Client) -> None:
    job_id = canceled_job(client)
    retried = client.retry(job_id)
    assert isinstance(retried, models.RetryAccepted) and retried.outcome == "retried"
    assert client.retry(job_id).outcome == "already_retried"
    assert retried.retry.retry_of == job_id
    bulk = client.retry_matching(status="canceled", agent_id="nobody-has-this")
    assert isinstance(bulk, models.BulkRetried) and bulk.count == 0


def test_objectives_create_list_read_and_cancel(client: Client, tmp_path: Path) -> None:
    objective_id = new_id("objective")
    spec = {
        "objectiveId": objective_id,
        "title": "client",
        "goal": "a one-task graph",
        "tasks": [{"taskId": "t", "input": {"command": ["true"]}}],
    }
    path = tmp_path / "objective.json"
    path.write_text(json.dumps(spec))
    accepted = client.create_objective(path)
    assert isinstance(accepted, models.ObjectiveAccepted)
    assert accepted.objective_id == objective_id
    assert client.create_objective(spec).job.job_id == accepted.job.job_id  # a re-post
    as_yaml = tmp_path / "objective.yaml"  # as `receipt objectives run` reads it
    as_yaml.write_text(yaml.safe_dump(spec))
    assert client.create_objective(as_yaml).job.job_id == accepted.job.job_id
    as_yaml.write_text("- a list\n- not an objective\n")
    with pytest.raises(ValueError, match="one object"):
        client.create_objective(as_yaml)
    # No worker runs the objective's `factory.run` job here: the objective is not created yet.
    with pytest.raises(NotFound) as missing:
        client.get_objective(objective_id)
    assert missing.value.code == "not_found"
    assert isinstance(client.list_objectives(limit=5), models.ObjectiveList)
    listed = list(client.iter_objectives(status="active", limit=5))
    assert all(o.status == "active" and o.organization_id == "org-a" for o in listed)
    with Client(client.url, TOKEN_ADMIN) as admin:  # an admin token names the organization
        chosen = admin.list_objectives(organization_id="org-b", limit=5).objectives
        assert all(o.organization_id == "org-b" for o in chosen)
    # A cancel before the run job created it aborts the run job (canceled while it waits).
    canceled = client.cancel_objective(objective_id, reason="changed my mind")
    assert canceled.status == "canceled" and canceled.cancel_requested
    with pytest.raises(NotFound, match="ended canceled without creating it"):
        client.get_objective(objective_id)
    with pytest.raises(NotFound):
        client.objective_events(objective_id)


def test_agent_jobs_create_read_events_cancel_and_sessions(client: Client) -> None:
    body = agent_job_body()
    created = client.create_agent_job(body)
    assert isinstance(created, models.AgentJobAnswer)
    agent_job_id = created.agent_job.agent_job_id
    again = client.create_agent_job(body)  # the same tool call
    assert again.agent_job.agent_job_id == agent_job_id and again.created is False
    view = client.get_agent_job(agent_job_id)
    assert isinstance(view, models.AgentJobView) and view.status == "queued"
    events = client.agent_job_events(agent_job_id)
    assert [r.type for r in events.receipts] == ["agent_job.created"]
    with pytest.raises(Conflict) as not_waiting:  # it asked nothing
        client.answer_agent_job(agent_job_id, "yes")
    assert not_waiting.value.status == 409
    canceled = client.cancel_agent_job(agent_job_id, reason="not needed")
    assert canceled.agent_job.status == "stopped"
    assert [r.type for r in client.follow_agent_job(agent_job_id)][-1].startswith("agent_job.")
    session = body["ownerSessionId"]
    listed = client.session_agent_jobs(session)
    assert [j.agent_job_id for j in listed.agent_jobs] == [agent_job_id]
    mine = client.session_agent_jobs(session, agent_id=body["agentId"])
    assert [j.agent_job_id for j in mine.agent_jobs] == [agent_job_id]
    assert client.session_agent_jobs(session, agent_id="another-agent").agent_jobs == []
    assert isinstance(client.session_events(session), models.SessionEventsPage)


def test_each_refusal_is_the_exception_of_its_status(api: RunningApi, client: Client) -> None:
    with Client(api.url, "not-a-token") as stranger, pytest.raises(Unauthorized) as e401:
        stranger.get_job("x")
    with pytest.raises(Forbidden) as e403:
        client.enqueue("codex", task(org="org-b"))
    with pytest.raises(NotFound) as e404:
        client.get_job(new_id())
    with pytest.raises(Conflict) as e409:
        client.steer(canceled_job(client), {"late": True})
    with pytest.raises(PayloadTooLarge) as e413:
        client.enqueue("codex", task(stdin="x" * (2 * 1024 * 1024)))
    with pytest.raises(InvalidInput) as e422:
        client.enqueue("codex", {**task(), "kind": "factory.nope"})
    assert [e.value.status for e in (e401, e403, e404, e409, e413, e422)] == [
        401,
        403,
        404,
        409,
        413,
        422,
    ]
    assert (e404.value.code, e409.value.code) == ("not_found", "terminal_state")
    assert (e422.value.field, e422.value.allowed) == ("payload.kind", list(KINDS))
    assert "payload.kind" in str(e422.value) and "422 invalid_input" in str(e422.value)


def test_a_limit_is_rate_limited_and_open_mode_takes_json_only(db_url: str, tmp_path: Path) -> None:
    """An api without tokens (open mode, loopback) and with a one-job burst per organization."""
    limited = {
        "RECEIPT_API_TOKENS": "",
        "RECEIPT_ORG_ENQUEUE_RATE": "0.01",
        "RECEIPT_ORG_ENQUEUE_BURST": "1",
    }
    with running_api(db_url, tmp_path, **limited) as api, Client(api.url, "") as client:
        client.enqueue("codex", task(org="org-limited"))
        with pytest.raises(RateLimited) as e429:
            client.enqueue("codex", task(org="org-limited"))
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        e415 = error_of(client.http.post("/agents/codex/jobs", content=b"kind=x", headers=form))
    assert e429.value.status == 429 and e429.value.code == "too_many_requests"
    assert e429.value.retry_after is not None and e429.value.retry_after >= 1
    assert isinstance(e415, UnsupportedMediaType)
    assert (e415.status, e415.code, e415.field) == (415, "unsupported_media_type", "Content-Type")


def test_a_stream_the_api_keeps_refusing_ends_in_its_own_refusal(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the token's cap of open streams, `follow` tries again (not before the API's
    Retry-After) and, refused each time, raises the API's 429 as `RateLimited` — not a
    `ConnectionFailed` that says the stream was lost."""
    from receipt_client import _sync_base as sync

    monkeypatch.setattr(sync, "RECONNECT_ATTEMPTS", 1)
    slept: list[float] = []
    capped = {"RECEIPT_SSE_MAX_STREAMS_PER_CALLER": "1"}
    with running_api(db_url, tmp_path, **capped) as api, Client(api.url, TOKEN_A) as client:
        job = client.enqueue("codex", task()).job.job_id
        headers = {"Accept": "text/event-stream", "Authorization": f"Bearer {TOKEN_A}"}
        with httpx.stream("GET", f"{api.url}/jobs/{job}/events", headers=headers, timeout=10):
            monkeypatch.setattr(sync.time, "sleep", slept.append)  # the waits follow makes
            with pytest.raises(RateLimited) as refused:
                list(client.follow(job))
            monkeypatch.undo()
    assert refused.value.status == 429 and "RECEIPT_SSE_MAX_STREAMS_PER_CALLER" in str(
        refused.value
    )
    retry_after = refused.value.retry_after
    assert slept and retry_after is not None and min(slept) >= retry_after


def test_an_unreachable_api_is_a_connection_failure() -> None:
    with Client("http://127.0.0.1:9", TOKEN_A) as client, pytest.raises(ConnectionFailed):
        client.get_job("x")


async def test_the_async_client_answers_the_same_models(api: RunningApi) -> None:
    async with AsyncClient(api.url, TOKEN_A) as client:
        job_id = new_id()
        accepted = await client.enqueue("codex", task(), job_id=job_id)
        assert isinstance(accepted, models.EnqueueAccepted) and accepted.outcome == "created"
        await client.steer(job_id, "go")
        with pytest.raises(WaitTimedOut):
            await client.wait(job_id, timeout=0.5)
        await client.abort(job_id)
        done = await client.wait(job_id, timeout=30)
        assert done.status == "canceled" and done.pending_commands == []
        assert [r.type async for r in client.follow(job_id)][-1] == "job.canceled"
        jobs = [j.job_id async for j in client.iter_jobs(status="canceled", limit=3)]
        assert job_id in jobs
        with pytest.raises(NotFound):
            await client.get_job(new_id())


def test_a_job_stream_s_events_are_the_shapes_the_document_names(client: Client) -> None:
    """Each `message` is a `ReceiptView`, the `end` a `JobStreamEnd` (`x-events`)."""
    job_id = canceled_job(client)
    headers = {"Accept": "text/event-stream"}
    with client.http.stream("GET", f"/jobs/{job_id}/events", headers=headers) as response:
        events = list(parse_sse(response.iter_lines()))
    messages = [e for e in events if e.name == "message" and e.data]
    assert [models.ReceiptView.model_validate_json(e.data).seq for e in messages] == [1, 2, 3]
    (end,) = [e for e in events if e.name == "end"]
    assert models.JobStreamEnd.model_validate_json(end.data).status == "canceled"


def test_a_post_that_names_no_id_is_sent_again_with_its_idempotency_key(client: Client) -> None:
    """What the error of a post whose answer was lost asks for: the same call with the same
    key finds what the first one made (an objective, a command, a schedule, a webhook)."""
    key = f"key-{uuid.uuid4().hex}"
    objective = {
        "title": "t",
        "goal": "g",
        "tasks": [{"taskId": "t", "input": {"command": ["true"]}}],
    }
    made = [client.create_objective(objective, idempotency_key=key) for _ in range(2)]
    assert [m.outcome for m in made] == ["created", "existing"]
    assert made[0].objective_id == made[1].objective_id
    job_id = new_id()
    client.enqueue("codex", task(), job_id=job_id)
    steers = [client.steer(job_id, {"say": "x"}, idempotency_key=key) for _ in range(2)]
    assert steers[0].command_id == steers[1].command_id
    schedule = {"interval": "60s", "agentId": "codex", "job": {"payload": task()}}
    schedules = [client.create_schedule(schedule, idempotency_key=key) for _ in range(2)]
    assert schedules[0].schedule_id == schedules[1].schedule_id
    client.delete_schedule(schedules[0].schedule_id)
