"""Codex jobs through the real stack, sandboxed: what the command sandbox promises (README,
Security; docs/design.md §9), seen from jobs."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from activities.sandbox import SandboxSettings, probe
from activities.workspaces import job_workspace
from receipts import operations as ops
from receipts.store import Store
from tests.integration.delivery.conftest import running_stack, wait_for_status
from tests.integration.helpers import put
from tests.integration.test_sandbox import host_processes_running, wait_until_running
from tests.integration.test_sandbox_neighbours import FILL_BYTES, volume  # noqa: F401


@pytest.fixture(autouse=True)
async def sandbox_available() -> None:
    ok, message = await probe(SandboxSettings.load(os.environ))
    if not ok:
        pytest.skip(f"SANDBOX TESTS NOT RUN: bubblewrap cannot create namespaces here: {message}")


def task(*argv: str, **fields: Any) -> dict[str, Any]:
    return {"task": {"command": list(argv), **fields}}


async def test_a_job_running_env_and_reading_proc_sees_no_worker_secret(
    client: Client, fresh_store: Store, fresh_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = uuid.uuid4().hex
    secrets = {
        "RECEIPT_API_TOKENS": f"admin-{marker}:org-a:admin",
        "RECEIPT_CALLBACK_SIGNING_SECRET": f"whsec-{marker}",
        "RECEIPT_DATABASE_URL": f"postgresql://u:pw-{marker}@127.0.0.1/db",
    }
    for key, value in secrets.items():
        monkeypatch.setenv(key, value)  # this process is the worker
    script = "env; for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\\0' '\\n' < $f; done"
    async with running_stack(client, fresh_store, fresh_db):
        job = (await put(fresh_store, payload_extra=task("sh", "-c", script))).job
        done = await wait_for_status(fresh_store, job.job_id)
    assert done.status == "completed", done.error
    shown = done.result["outputTail"]
    receipts = await fresh_store.read_stream(f"jobs/{job.job_id}")
    shown += "".join(r.data["data"]["output"] for r in receipts if r.type == "job.progress")
    assert f"HOME={job_workspace('org-a', job.job_id, SandboxSettings.load(os.environ))}" in shown
    assert marker not in shown
    assert "RECEIPT_" not in shown


async def test_an_abort_kills_the_sandbox_with_its_setsid_grandchild(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    needle = f"64.{uuid.uuid4().int % 10**6:06d}"
    script = f"setsid sleep {needle} </dev/null >/dev/null 2>&1 & sleep 60"
    async with running_stack(client, fresh_store, fresh_db):
        job = (await put(fresh_store, payload_extra=task("sh", "-c", script))).job
        await wait_until_running(needle)
        sent = await ops.add_command(
            fresh_store, job.job_id, type="abort", reason="stop", organization_id="org-a"
        )
        assert sent.ok
        done = await wait_for_status(fresh_store, job.job_id, timeout=30)
    assert done.status == "canceled"
    assert host_processes_running(needle) == []


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, "payload.task.env may not set 'LD_PRELOAD'"),
        ({"env": {"RECEIPT_DATABASE_URL": "x"}}, "payload.task.env may not set 'RECEIPT_DAT"),
        ({"env": {"PATH": "/tmp"}}, "payload.task.env may not set 'PATH'"),
        ({"cwd": "/"}, "payload.task.cwd must be a path relative to the workspace"),
        ({"cwd": "../.."}, "payload.task.cwd must be a path relative to the workspace"),
    ],
)
async def test_forbidden_env_keys_and_cwd_escapes_fail_the_job_without_a_retry(
    client: Client, fresh_store: Store, fresh_db: str, fields: dict[str, Any], message: str
) -> None:
    async with running_stack(client, fresh_store, fresh_db):
        job = (await put(fresh_store, maxAttempts=3, payload_extra=task("true", **fields))).job
        done = await wait_for_status(fresh_store, job.job_id)
    assert (done.status, done.attempt) == ("failed", 1)
    assert done.error is not None and done.error.startswith(message)


async def test_jobs_of_one_objective_share_its_workspace(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    objective = f"obj-{uuid.uuid4().hex[:8]}"
    async with running_stack(client, fresh_store, fresh_db):
        first = (
            await put(
                fresh_store,
                payload_extra={"objectiveId": objective, **task("sh", "-c", "echo 1 > note")},
            )
        ).job
        assert (await wait_for_status(fresh_store, first.job_id)).status == "completed"
        second = (
            await put(fresh_store, payload_extra={"objectiveId": objective, **task("cat", "note")})
        ).job
        done = await wait_for_status(fresh_store, second.job_id)
    assert (done.status, done.result["outputTail"]) == ("completed", "1\n")


async def test_a_job_filling_the_workspace_volume_fails_and_its_neighbour_completes(
    client: Client,
    fresh_store: Store,
    fresh_db: str,
    volume: Path,  # noqa: F811 (the fixture imported above)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two organizations' jobs on one worker, one volume of 96 MiB for their workspaces. The
    # filler writes 1 MiB files (each under the file-size limit) without end; its neighbour
    # writes 4 MiB a few seconds later. Without a bound the filler took the whole volume and
    # the neighbour failed (exit 1, no space left on device).
    monkeypatch.setenv("RECEIPT_WORKSPACE_ROOT", str(volume / "workspaces"))
    monkeypatch.setenv("RECEIPT_SANDBOX_FILE_SIZE_MB", "8")
    monkeypatch.setenv("RECEIPT_SANDBOX_WORKSPACE_MB", "16")
    neighbour_script = "sleep 6; head -c 4194304 /dev/zero > out && echo wrote"
    async with running_stack(client, fresh_store, fresh_db):
        filler = (await put(fresh_store, payload_extra=task("sh", "-c", FILL_BYTES))).job
        neighbour = (
            await put(fresh_store, org="org-b", payload_extra=task("sh", "-c", neighbour_script))
        ).job
        filled = await wait_for_status(fresh_store, filler.job_id, timeout=60)
        done = await wait_for_status(fresh_store, neighbour.job_id, timeout=60)
    assert (done.status, done.result["outputTail"]) == ("completed", "wrote\n"), done.error
    assert filled.status == "failed"
    assert filled.error is not None and "workspace grew past its bound" in filled.error
