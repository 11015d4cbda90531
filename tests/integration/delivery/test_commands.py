"""No command is silently dropped: a steerable task's command gets each steer on its stdin and
consumes it once; a command that no handler of the job reads is settled visibly, with the
reason, in the transaction that ends the job (`queue.command.unconsumed`)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from temporalio.client import Client

from activities.sandbox import SandboxSettings, probe
from receipts import operations as ops
from receipts.store import Store
from tests.integration.delivery.conftest import running_stack, wait_for_status
from tests.integration.helpers import put, types


@pytest.fixture
async def sandbox_available() -> None:
    ok, message = await probe(SandboxSettings.load(os.environ))
    if not ok:
        pytest.skip(f"SANDBOX TESTS NOT RUN: bubblewrap cannot create namespaces here: {message}")


def task(script: str, **fields: Any) -> dict[str, Any]:
    return {"task": {"command": ["sh", "-c", script], **fields}}


async def steer(store: Store, job_id: str, payload: Any, type_: str = "steer") -> str:
    out = await ops.add_command(store, job_id, type=type_, payload=payload, organization_id="org-a")
    assert out.ok and out.job is not None
    return out.job.commands[-1].command_id


@pytest.mark.usefixtures("sandbox_available")
async def test_a_steerable_tasks_command_reads_each_steer_on_stdin_once(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    # The command waits for one line on stdin, prints it, and ends.
    script = 'read line; echo "got: $line"'
    async with running_stack(client, fresh_store, fresh_db):
        job = (await put(fresh_store, payload_extra=task(script, steerable=True))).job
        await wait_for_status(fresh_store, job.job_id, ("running",))
        command_id = await steer(fresh_store, job.job_id, {"say": "use the other file"})
        done = await wait_for_status(fresh_store, job.job_id)
    assert done.status == "completed", done.error
    line = done.result["outputTail"].strip().removeprefix("got: ")
    assert json.loads(line) == {
        "type": "steer",
        "commandId": command_id,
        "payload": {"say": "use the other file"},
    }
    chain = await types(fresh_store, job.job_id)
    assert chain.count("queue.command.consumed") == 1
    assert "queue.command.unconsumed" not in chain
    assert done.pending_commands == ()


@pytest.mark.usefixtures("sandbox_available")
async def test_a_steer_to_a_task_that_takes_none_is_settled_unconsumed_with_the_reason(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    # Without `steerable`, stdin is closed at once: `cat` ends, the steer stays unread.
    async with running_stack(client, fresh_store, fresh_db):
        job = (await put(fresh_store, payload_extra=task("sleep 2; cat"))).job
        await wait_for_status(fresh_store, job.job_id, ("running",))
        command_id = await steer(fresh_store, job.job_id, {"say": "hello?"})
        done = await wait_for_status(fresh_store, job.job_id)
    assert done.status == "completed" and done.pending_commands == ()
    receipts = await fresh_store.read_stream(f"jobs/{job.job_id}")
    assert [r.type for r in receipts][-2:] == ["queue.command.unconsumed", "job.completed"]
    assert receipts[-2].data["commandId"] == command_id
    assert "steerable" in receipts[-2].data["reason"]
    [command] = done.commands
    assert command.unconsumed == receipts[-2].data["reason"]


@pytest.mark.parametrize(
    ("agent", "kind", "command"),
    [
        ("factory", "factory.run", "steer"),
        ("factory-monitor", "factory.task.monitor", "follow_up"),
        ("factory-control", "factory.objective.audit", "steer"),
        ("nobody-home", "factory.task.run", "follow_up"),
    ],
)
async def test_a_command_of_a_kind_that_reads_none_is_settled_when_the_job_ends(
    store: Store, agent: str, kind: str, command: str
) -> None:
    """Each way a job ends settles what it left unread, just before its terminal receipt."""
    for end in ("complete", "fail", "cancel_queued"):
        extra = {"objective": {"title": "t", "goal": "g"}} if kind == "factory.run" else {}
        job = (await put(store, agent, kind=kind, payload_extra=extra)).job
        command_id = await steer(store, job.job_id, {"n": 1}, command)
        if end == "cancel_queued":
            assert (await ops.cancel_queued(store, job.job_id, reason="test")).ok
        else:
            worker = f"{job.job_id}:attempt:1/1"
            started = await ops.start_attempt(
                store, job.job_id, attempt=1, worker_id=worker, lease_ms=60_000
            )
            assert started.ok
            if end == "complete":
                out = await ops.complete(store, job.job_id, worker_id=worker, attempt=1, result={})
            else:
                out = await ops.fail(
                    store, job.job_id, worker_id=worker, attempt=1, error="x", retryable=False
                )
            assert out.ok
        receipts = await store.read_stream(f"jobs/{job.job_id}")
        unread = receipts[-2]
        assert unread.type == "queue.command.unconsumed", [r.type for r in receipts]
        assert unread.data["commandId"] == command_id
        if agent == "nobody-home":
            assert unread.data["reason"].startswith("no handler runs agent 'nobody-home'")
        else:
            assert unread.data["reason"] == f"{kind} jobs do not read {command} commands"
        settled = await store.get_job(job.job_id)
        assert settled is not None and settled.terminal and settled.pending_commands == ()
