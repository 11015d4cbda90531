"""A command's arguments and environment entries at the kernel's bound (MAX_ARG_STRLEN): one the
sandbox can start runs, one it cannot is refused when it is posted (422 naming the field), not
accepted and failed at the worker with `Argument list too long`."""

from __future__ import annotations

import os
from typing import Any

import httpx
import pytest
from temporalio.client import Client

from activities.sandbox import SandboxSettings, probe
from receipts.executables import MAX_ARG_BYTES
from receipts.store import Store
from tests.integration.api_support import AS_A, api_client, enqueue_body
from tests.integration.delivery.conftest import running_stack, wait_for_status
from tests.integration.helpers import put

OVER = "x" * (MAX_ARG_BYTES + 1)


def refused(response: httpx.Response) -> str:
    assert response.status_code == 422, response.text[:300]
    error = response.json()["error"]
    assert str(MAX_ARG_BYTES) in error["message"], error
    return str(error["field"])


async def test_a_command_the_sandbox_could_not_start_is_refused_when_posted(db_url: str) -> None:
    """Accepted before (202), each failed at the worker: the argument `could not start 'sh':
    [Errno 7] Argument list too long`, the environment entry as `command exited with status 1`
    (bwrap's own `execvp sh: Argument list too long`)."""
    as_task: list[tuple[dict[str, Any], str]] = [
        ({"command": ["sh", "-c", "true", OVER]}, "payload.task.command[3]"),
        ({"command": ["true"], "env": {"BIG": OVER}}, "payload.task.env.BIG"),
        # 4-byte characters: the bound is the UTF-8 bytes the command is given.
        ({"command": ["echo", "😀" * (MAX_ARG_BYTES // 4 + 1)]}, "payload.task.command[1]"),
    ]
    objective = {
        "title": "big",
        "goal": "an argument past the bound",
        "tasks": [{"taskId": "t", "input": {"command": ["echo", OVER]}}],
    }
    async with api_client(db_url) as client:
        # The worker's database holds the jobs of the tests before this one: nothing added.
        before = (await client.get("/jobs", headers=AS_A, params={"limit": 200})).json()["jobs"]
        for task, field in as_task:
            body = enqueue_body(payload_extra={"task": task})
            posted = await client.post("/agents/codex/jobs", json=body, headers=AS_A)
            assert refused(posted) == field
        posted = await client.post("/objectives", json=objective, headers=AS_A)
        assert refused(posted) == "tasks[0].input.command[1]"
        listed = await client.get("/jobs", headers=AS_A, params={"limit": 200})
        assert listed.status_code == 200 and listed.json()["jobs"] == before


async def test_an_argument_and_an_environment_entry_at_the_bound_run(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    """The bound is the kernel's, not below it: what is refused could not have run."""
    ok, message = await probe(SandboxSettings.load(os.environ))
    if not ok:
        pytest.skip(f"SANDBOX TESTS NOT RUN: bubblewrap cannot create namespaces here: {message}")
    longest = "y" * MAX_ARG_BYTES
    entry = "z" * (MAX_ARG_BYTES - len("BIG="))
    script = 'printf "%s %s" "${#1}" "${#BIG}"'
    task = {"command": ["sh", "-c", script, "sh", longest], "env": {"BIG": entry}}
    async with running_stack(client, fresh_store, fresh_db):
        job = (await put(fresh_store, payload_extra={"task": task})).job
        done = await wait_for_status(fresh_store, job.job_id)
    assert done.status == "completed", done.error
    assert done.result["outputTail"] == f"{MAX_ARG_BYTES} {len(entry)}"
