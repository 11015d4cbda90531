"""A team's own agent and the typed client against real role processes: the example handler
(examples/release-bot, installed through its entry point by `make install`) run by worker-chat
under its lease, fence and settle, driven through receipt-client; a worker whose installed
handler fails to import stays unready; `AsyncClient.wait()` across an api restart."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from receipt_client import AsyncClient, Client, models
from receipts.store import Store
from receipts.tenancy import scoped_id
from roles.infra.ports import free_port
from tests.e2e.roles_harness import RoleProcesses, wait_for
from tests.eventually import eventually
from tests.integration.api_support import TOKEN_A, TOKENS, wait_healthz

pytestmark = pytest.mark.e2e

# Lease 10 s (a heartbeat every 3.3 s); Temporal redelivers after 3 s without hearing from a
# worker, so a SIGKILLed worker's attempt is redelivered in seconds.
TIMING = {
    "JOB_LEASE_MS": "10000",
    "CODEX_JOB_LEASE_MS": "10000",
    "RECEIPT_WORKER_LOST_TIMEOUT_MS": "3000",
}
AUTH = {"userId": "u", "organizationId": "org-a"}


def release(**fields: Any) -> dict[str, Any]:
    """A release-bot job's payload."""
    return {"kind": "factory.task.run", "authContext": AUTH, **fields}


def stack(roles: Callable[..., RoleProcesses], *names: str) -> tuple[RoleProcesses, str]:
    """An api with the test tokens and the role processes `names` (`name` or `name:role`)."""
    port = free_port()
    procs = roles(RECEIPT_API_PORT=str(port), RECEIPT_API_TOKENS=TOKENS, **TIMING)
    procs.start("api")
    for name in names:
        process, _, role = name.partition(":")
        procs.start(process, role or None)
    url = f"http://127.0.0.1:{port}"
    wait_healthz(url)
    return procs, url


def types(receipts: list[models.ReceiptView]) -> list[str]:
    return [r.type for r in receipts]


def at(receipt: models.ReceiptView) -> datetime:
    return receipt.recorded_at


async def test_the_example_agent_runs_progresses_reads_a_steer_once_and_retries_later(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses]
) -> None:
    procs, url = stack(roles, "driver", "worker-chat", "worker-codex")
    try:
        async with AsyncClient(url, TOKEN_A) as client:
            payload = release(version="1.4.0", stepSeconds=1.5, registryBusyAttempts=1)
            await client.enqueue("release-bot", payload, job_id="release-1", max_attempts=3)
            seen: list[models.ReceiptView] = []
            steered = False
            async for receipt in client.follow("release-1"):
                seen.append(receipt)
                if receipt.type == "job.progress" and not steered:
                    await client.steer("release-1", {"note": "ships the new parser"})
                    steered = True
            job = await client.get_job("release-1")
            # An abort cancels the handler: a release whose first step takes 20 s.
            await client.enqueue("release-bot", release(version="2.0.0", stepSeconds=20),
                                 job_id="release-slow")  # fmt: skip
            await wait_for(e2e_store[0], scoped_id("org-a", "release-slow"), ("running",))
            aborted_at = time.monotonic()
            await client.abort("release-slow", reason="not this week")
            slow = await client.wait("release-slow")
            abort_s = time.monotonic() - aborted_at
            # A handler that raises: retried, then failed with its message.
            await client.enqueue("release-bot", release(version="one"), job_id="release-bad")
            bad = await client.wait("release-bad")
            # A handler that runs its command in the sandbox, on the group it names (codex).
            await client.enqueue(
                "release-check", release(check=["sh", "-c", "echo checked; exit 3"]),
                job_id="check-1", max_attempts=1,
            )  # fmt: skip
            check = await client.wait("check-1")
            check_leases = [r async for r in client.receipts("check-1") if r.type == "job.leased"]
    except BaseException:
        print(procs.logs())
        raise
    assert (job.status, job.attempt) == ("completed", 2)
    assert job.result == {
        "released": "1.4.0",
        "steps": ["build", "tag", "publish"],
        "notes": ["ships the new parser"],
        "attempt": 2,
    }
    kinds = types(seen)
    first_failure = kinds.index("job.failed")
    assert seen[first_failure].data["error"] == "the registry is busy"
    releases = [r for r in seen if r.type == "job.leased"]
    assert [r.data["attempt"] for r in releases] == [1, 2]
    # Retry(delay_ms=2000): the second attempt is leased no sooner than 2 s after the failure.
    assert (at(releases[1]) - at(seen[first_failure])).total_seconds() >= 2.0
    steps = [r.data["data"]["step"] for r in seen if r.type == "job.progress"]
    assert steps == ["build", "tag", "publish"]
    consumed = [r for r in seen if r.type == "queue.command.consumed"]
    assert len(consumed) == 1 and kinds.count("queue.command") == 1
    assert kinds[-1] == "job.completed" and kinds.count("job.completed") == 1

    assert (slow.status, slow.canceled_reason) == ("canceled", "not this week")
    assert abort_s < 15, f"the abort took {abort_s:.1f} s"
    assert bad.status == "failed" and bad.attempt == 2
    assert bad.error == "ValueError: not a release version: 'one' (expected MAJOR.MINOR.PATCH)"
    assert check.status == "failed" and check.error == "the check exited with status 3"
    assert check.route == "receipt-codex"
    assert [r.data["process"]["role"] for r in check_leases] == ["worker-codex"]
    assert check.result is not None and "checked" in check.result["tail"]
    loaded = procs.logged("worker-chat", {"handlers.loaded"})
    assert loaded and set(loaded[0]["installed"]) >= {"release-bot", "release-check"}


async def test_a_sigkilled_worker_s_job_is_redelivered_and_settled_exactly_once(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses]
) -> None:
    store, _ = e2e_store
    procs, url = stack(roles, "driver", "worker-chat-1:worker-chat", "worker-chat-2:worker-chat")
    try:
        with Client(url, TOKEN_A) as client:
            client.enqueue("release-bot", release(version="3.0.0", stepSeconds=2), job_id="kill-1")
            running = await wait_for(store, scoped_id("org-a", "kill-1"), ("running",))
            assert running.lease is not None and running.lease.process is not None
            holder = procs.name_of(int(running.lease.process["pid"]))
            assert holder is not None
            procs.kill(holder)
            job = await asyncio.to_thread(client.wait, "kill-1")
            receipts = list(client.receipts("kill-1"))
    except BaseException:
        print(procs.logs())
        raise
    assert job.status == "completed" and job.result is not None
    assert job.result["released"] == "3.0.0"
    kinds = types(receipts)
    assert kinds.count("job.completed") == 1
    assert not {"job.failed", "job.canceled"} & set(kinds)
    # The first delivery's lease was taken over (or expired and the attempt ran again).
    holders = {
        r.data.get("workerId") for r in receipts if r.type in ("job.leased", "job.heartbeat")
    }
    assert len(holders) >= 2


async def test_a_worker_whose_installed_handler_fails_to_import_is_not_ready(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses], tmp_path: Path
) -> None:
    """A package whose entry point names a module that is not there: the worker says which, in
    its log and its /readyz, and polls no task queue (the agent's jobs wait for a worker that
    loaded it instead of failing `No handler`)."""
    site = tmp_path / "site"
    dist = site / "broken_bot-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-bot\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[receipt.handlers]\nbroken-bot = broken_bot_gone:run\n")
    port = free_port()
    procs = roles(RECEIPT_METRICS_PORT=str(port), PYTHONPATH=str(site), **TIMING)
    procs.start("worker-chat")
    try:
        async with httpx.AsyncClient(timeout=5) as http:

            async def readyz() -> httpx.Response | None:
                try:
                    return await http.get(f"http://127.0.0.1:{port}/readyz")
                except httpx.TransportError:
                    return None

            answer = await eventually(
                readyz,
                lambda r: r is not None and "handlers:" in r.text,
                timeout=60,
                every=0.5,
                what="/readyz naming the handler that failed",
            )
            await asyncio.sleep(6)  # a check later it is still not ready
            again = await readyz()
    except BaseException:
        print(procs.logs())
        raise
    assert answer is not None and again is not None
    assert again.status_code == 503
    reasons = json.loads(again.text)["reasons"]
    failed = next(r for r in reasons if r.startswith("handlers:"))
    assert "broken-bot = broken_bot_gone:run of broken-bot 0.1" in failed
    assert "ModuleNotFoundError" in failed
    assert any("no activity poll" in r for r in reasons)  # it polls nothing
    logged = procs.logged("worker-chat", {"handlers.load_failed"})
    assert logged and "broken_bot_gone" in logged[0]["failures"][0]


async def test_async_waits_follow_a_job_and_an_objective_across_an_api_restart(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses]
) -> None:
    """`wait()`, `follow()` and `wait_objective()` of one AsyncClient while the api is SIGKILLed
    and restarted: each resumes with Last-Event-ID; the job's receipts arrive once each, the
    objective is returned settled and audited."""
    procs, url = stack(roles, "driver", "worker-chat", "worker-codex", "worker-control")
    steps = [f"step-{n}" for n in range(8)]
    objective = {
        "objectiveId": "restart-objective",
        "title": "across a restart",
        "goal": "two tasks, one after the other",
        "tasks": [
            {"taskId": "a", "input": {"command": ["sh", "-c", "sleep 2; echo a > a.txt"]}},
            {"taskId": "b", "dependsOn": ["a"], "input": {"command": ["cat", "a.txt"]}},
        ],
    }
    try:
        async with AsyncClient(url, TOKEN_A) as client:
            await client.enqueue(
                "release-bot", release(version="4.0.0", steps=steps, stepSeconds=1),
                job_id="restart-1",
            )  # fmt: skip
            accepted = await client.create_objective(objective)
            followed: list[models.ReceiptView] = []

            async def follow() -> None:
                async for receipt in client.follow("restart-1"):
                    followed.append(receipt)

            following = asyncio.create_task(follow())
            waiting = asyncio.create_task(client.wait("restart-1"))
            settling = asyncio.create_task(client.wait_objective(accepted))
            await eventually(
                lambda: asyncio.sleep(0, followed),
                lambda seen: any(r.type == "job.progress" for r in seen),
                timeout=60,
                what="the job's first progress",
            )
            procs.kill("api")  # SIGKILL mid-stream
            await asyncio.sleep(1.5)
            procs.start("api")
            job = await asyncio.wait_for(waiting, 90)
            await asyncio.wait_for(following, 30)
            settled = await asyncio.wait_for(settling, 120)
            written = [r async for r in client.receipts("restart-1")]
    except BaseException:
        print(procs.logs())
        raise
    assert job.status == "completed" and job.result is not None
    assert job.result["steps"] == steps
    assert [r.seq for r in followed] == [r.seq for r in written]  # none lost, none repeated
    assert [r.seq for r in written] == list(range(1, len(written) + 1))
    assert procs.restarts["api"] == 1
    assert (settled.objective_id, settled.status) == ("restart-objective", "completed")
    assert settled.audit is not None and settled.tasks is not None
    assert [(t.task_id, t.status) for t in settled.tasks] == [
        ("a", "completed"),
        ("b", "completed"),
    ]
