"""A job's or an agent job's event stream resumed at the head of its history reads and folds
nothing behind it: the stream starts from the projection row (its state at its seq), as an
objective's does. It was folded from seq 1 at every open, on the api's event loop, to know when
to end."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from receipts import jobs as jobmodel
from receipts import operations as ops
from receipts.agent_jobs import model as agent_model
from receipts.store import Store
from tests.integration.api_support import AS_A, api_client, enqueue_body, events, rid

LEASE_MS = 60_000
STREAM = {**AS_A, "Accept": "text/event-stream"}


async def _read(
    api: httpx.AsyncClient, job_id: str, last: int, kind: str = "jobs"
) -> tuple[list[int], Any]:
    seqs: list[int] = []
    headers = {**STREAM, "Last-Event-ID": str(last)}
    async with api.stream("GET", f"/{kind}/{job_id}/events", headers=headers) as response:
        async for event in events(response):
            if event.name == "end":
                return seqs, json.loads(event.data)
            seqs.append(json.loads(event.data)["seq"])
    raise AssertionError(f"no end event after {seqs}")


async def test_a_resumed_job_stream_folds_only_what_follows_the_job_as_it_stands(
    store: Store, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    folded: list[int] = []  # the seqs the api folds into the job's state
    real_apply = jobmodel.apply

    def counted(state: Any, receipt: Any) -> Any:
        folded.append(receipt.seq)
        return real_apply(state, receipt)

    async with api_client(db_url, store=store) as api:
        posted = await api.post("/agents/codex/jobs", json=enqueue_body(), headers=AS_A)
        assert posted.status_code == 202, posted.text
        job_id = posted.json()["job"]["jobId"]
        runtime_id, worker = rid(job_id), f"{rid(job_id)}:attempt:1/1"
        lease = await ops.lease(store, runtime_id, attempt=1, worker_id=worker, lease_ms=LEASE_MS)
        assert lease.ok
        for n in range(300):
            done = await ops.progress(store, runtime_id, worker_id=worker, attempt=1, data=n)
            assert done.ok
        assert (await ops.complete(store, runtime_id, worker_id=worker, attempt=1)).ok
        head = (await store.get_job(runtime_id)).seq  # type: ignore[union-attr]
        monkeypatch.setattr(jobmodel, "apply", counted)  # the api's folds from here on
        seqs, end = await asyncio.wait_for(_read(api, job_id, head), 20)
        assert seqs == [] and end == {"jobId": job_id, "status": "completed"}
        assert folded == [], f"folded {len(folded)} receipts"
        # Behind the head: what follows is sent, nothing the projection had is folded again.
        seqs, end = await _read(api, job_id, head - 2)
        assert seqs == [head - 1, head] and folded == []
        assert end == {"jobId": job_id, "status": "completed"}


async def test_a_resumed_agent_job_stream_folds_nothing_behind_the_job_as_it_stands(
    store: Store, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    folded: list[int] = []  # the seqs the api folds into the agent job's state
    real_apply = agent_model.apply

    def counted(state: Any, receipt: Any) -> Any:
        folded.append(receipt.seq)
        return real_apply(state, receipt)

    async with api_client(db_url, store=store) as api:
        created = await api.post(
            "/agent-jobs",
            json={
                "agentId": "agent-resume",
                "ownerSessionId": "session-resume",
                "sourceActorEventId": "event-1",
                "sourceToolCallId": "tool-resume",
                "replyRoute": {"binding": "slack", "channel": "C1"},
                "input": {"prompt": "summarise the repo"},
            },
            headers=AS_A,
        )
        assert created.status_code == 201, created.text
        agent_job_id = created.json()["agentJob"]["agentJobId"]
        stopped = await api.post(
            f"/agent-jobs/{agent_job_id}/cancel", json={"reason": "done"}, headers=AS_A
        )
        assert stopped.status_code in (200, 202), stopped.text
        shown = await api.get(f"/agent-jobs/{agent_job_id}", headers=AS_A)
        assert shown.json()["status"] == "stopped", shown.text
        head = (await store.read_stream(agent_model.stream_of(agent_job_id)))[-1].seq
        assert head >= 2
        monkeypatch.setattr(agent_model, "apply", counted)  # the api's folds from here on
        seqs, end = await asyncio.wait_for(_read(api, agent_job_id, head, "agent-jobs"), 20)
        assert seqs == [] and end == {"agentJobId": agent_job_id, "status": "stopped"}
        assert folded == [], f"folded {len(folded)} receipts"
        seqs, end = await _read(api, agent_job_id, head - 1, "agent-jobs")
        assert seqs == [head] and folded == []
