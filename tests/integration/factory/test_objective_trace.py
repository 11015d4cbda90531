"""An objective posted with a caller's `traceparent` is one trace: its run job, control jobs,
tasks, validate and publish steps, monitors and audit all carry the caller's trace id."""

from __future__ import annotations

import secrets
from pathlib import Path

from temporalio.client import Client

from receipts.objectives.model import objective_stream
from receipts.store import Store
from receipts.tenancy import scoped_id
from tests.integration.api_support import AS_A, api_client
from tests.integration.delivery.conftest import running_stack
from tests.integration.factory.conftest import outbox_running, wait_objective


async def test_every_job_of_an_objective_joins_its_callers_trace(
    client: Client, fresh_store: Store, fresh_db: str, workspace_root: Path
) -> None:
    trace_id = secrets.token_hex(16)
    headers = {**AS_A, "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}
    objective = {
        "objectiveId": "traced",
        "title": "traced",
        "goal": "two tasks, validate and publish, in the caller's trace",
        "tasks": [
            {"taskId": "a", "input": {"command": ["true"]}},
            {"taskId": "b", "dependsOn": ["a"], "input": {"command": ["true"]}},
        ],
        "validate": {"command": ["true"]},
        "publish": {"command": ["true"]},
    }
    runtime_id = scoped_id("org-a", "traced")
    async with running_stack(client, fresh_store, fresh_db) as stack, outbox_running(stack):
        async with api_client(fresh_db, store=fresh_store) as api:
            posted = await api.post("/objectives", json=objective, headers=headers)
            assert posted.status_code == 202, posted.text
        state = await wait_objective(fresh_store, runtime_id, audited=True)
        async with api_client(fresh_db, store=fresh_store) as api:
            view = await api.get("/objectives/traced", headers=AS_A)
    assert state.status == "completed", state.error
    assert view.status_code == 200 and "traceparent" not in view.json()
    async with fresh_store.connection() as conn:
        cur = await conn.execute(
            "SELECT job_id FROM jobs WHERE job_id LIKE %s ORDER BY job_id", ("objective:traced:%",)
        )
        job_ids = [row[0] for row in await cur.fetchall()]
    kinds = set()
    for job_id in job_ids:
        job = await fresh_store.get_job(job_id)
        assert job is not None and job.trace_id == trace_id, (job_id, job and job.trace_id)
        kinds.add(job.kind)
    assert {
        "factory.run",
        "factory.objective.control",
        "factory.task.run",
        "factory.integration.validate",
        "factory.integration.publish",
        "factory.objective.audit",
    } <= kinds, kinds
    assert (await fresh_store.read_stream(objective_stream(runtime_id)))[0].data[
        "traceparent"
    ].split("-")[1] == trace_id
