"""A caller's `traceparent` on the routes that create work (a job, an objective, an agent job)
becomes the parent of the work's trace, whether or not spans are recorded (tests/e2e/
test_job_trace.py follows one job's trace through the real roles)."""

from __future__ import annotations

import secrets

import pytest

from receipts.agent_jobs import lifecycle
from receipts.objectives.model import run_job_id
from receipts.store import Store
from receipts.tenancy import scoped_id
from roles.infra.tracing import configure_tracing
from tests.integration.api_support import AS_A, api_client, enqueue_body, rid
from tests.integration.test_agent_jobs import dispatcher
from tests.integration.test_api_agent_jobs import body as agent_job_body


@pytest.fixture(autouse=True)
def tracer_provider() -> None:
    """The SDK's tracer provider, as every role process installs it (recording or not)."""
    configure_tracing("receipt-test")


def caller() -> tuple[str, str, dict[str, str]]:
    """A caller's trace id, span id, and the headers that carry them."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, {**AS_A, "traceparent": f"00-{trace_id}-{span_id}-01"}


async def test_a_job_joins_the_callers_trace_and_a_malformed_traceparent_starts_one(
    db_url: str, store: Store
) -> None:
    trace_id, span_id, headers = caller()
    async with api_client(db_url, store=store) as client:
        posted = await client.post("/agents/codex/jobs", json=enqueue_body(), headers=headers)
        assert posted.status_code == 202, posted.text
        malformed = await client.post(
            "/agents/codex/jobs",
            json=enqueue_body(),
            headers={**AS_A, "traceparent": "00-not-a-trace-01"},
        )
        untraced = await client.post("/agents/codex/jobs", json=enqueue_body(), headers=AS_A)
    job = await store.get_job(rid(posted.json()["job"]["jobId"]))
    assert job is not None and job.trace_id == trace_id
    # The job's own traceparent names the api's enqueue span, a child of the caller's.
    assert job.traceparent is not None
    version, in_trace, parent, _ = job.traceparent.split("-")
    assert (version, in_trace) == ("00", trace_id) and parent != span_id
    others = [await store.get_job(rid(a.json()["job"]["jobId"])) for a in (malformed, untraced)]
    ids = [j.trace_id for j in others if j is not None]
    assert len(ids) == 2 and ids[0] != ids[1] and all(len(i or "") == 32 for i in ids)


async def test_an_objectives_run_job_joins_the_callers_trace(
    fresh: tuple[Store, str],
) -> None:
    store, url = fresh
    trace_id, _, headers = caller()
    objective = {
        "objectiveId": "traced",
        "title": "t",
        "goal": "g",
        "tasks": [{"taskId": "a", "input": {"command": ["true"]}}],
    }
    async with api_client(url, store=store) as client:
        posted = await client.post("/objectives", json=objective, headers=headers)
    assert posted.status_code == 202, posted.text
    run = await store.get_job(run_job_id(scoped_id("org-a", "traced")))
    assert run is not None and run.trace_id == trace_id


async def test_an_agent_jobs_turns_join_the_callers_trace(fresh: tuple[Store, str]) -> None:
    store, url = fresh
    trace_id, _, headers = caller()
    async with api_client(url, store=store) as client:
        created = await client.post("/agent-jobs", json=agent_job_body(), headers=headers)
        assert created.status_code == 201, created.text
        view = created.json()["agentJob"]
    assert "traceparent" not in view  # its trace shows on its turns' queue jobs
    await dispatcher(store).run_once()
    job = await lifecycle.get(store, view["agentJobId"])
    assert job is not None and job.queue_job_id is not None
    turn = await store.get_job(job.queue_job_id)
    assert turn is not None and turn.trace_id == trace_id
    assert turn.traceparent is not None and trace_id in turn.traceparent
