"""Agent jobs with real role processes: two driver processes racing for one agent's slots, and
worker processes killed mid-turn."""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from receipts import operations as ops
from receipts import token_usage
from receipts.agent_jobs import claims, lifecycle, model
from receipts.agent_jobs.lifecycle import CreateRequest
from receipts.store import Store
from tests.e2e.roles_harness import RoleProcesses
from tests.fake_provider import USAGE_IN, USAGE_OUT, FakeProvider, running
from tests.integration.delivery.test_agent_jobs_delivery import scripted_registry

pytestmark = pytest.mark.e2e


def request(agent_id: str, prompt: str) -> CreateRequest:
    return CreateRequest(
        agent_id=agent_id,
        organization_id="org-a",
        owner_session_id=f"session-{uuid.uuid4().hex[:8]}",
        source_actor_event_id="event-1",
        source_tool_call_id=f"tool-{uuid.uuid4().hex[:8]}",
        reply_route={"binding": "slack", "channel": "C1", "thread": None},
        input={"prompt": prompt},
    )


async def max_running_in_the_chain(store: Store) -> tuple[int, int]:
    """Replay every agent-job stream in commit order; return (most running at once, claims)."""
    status: dict[str, str] = {}
    running = most = claims = 0
    after = 0
    while batch := await store.read_all(after, 1000):
        for receipt in batch:
            after = receipt.position
            if not receipt.stream.startswith(model.STREAM_PREFIX):
                continue
            if receipt.type == model.CREATED:
                status[receipt.stream] = "queued"
            elif receipt.type == model.TRANSITIONED:
                before, now = status[receipt.stream], str(receipt.data["to"])
                running += (now == "running") - (before == "running")
                claims += now == "running"
                status[receipt.stream] = now
                most = max(most, running)
    return most, claims


async def test_two_driver_processes_never_run_more_than_three(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses]
) -> None:
    store, _ = e2e_store
    procs = roles(RECEIPT_AGENT_JOB_REDRIVE_INTERVAL_MS="300")
    procs.start("driver-1", "driver")
    procs.start("driver-2", "driver")
    agent = "busy-agent"
    try:
        jobs = [(await lifecycle.create(store, request(agent, "done:x")))[0] for _ in range(12)]
        # No worker runs turns: each running job holds its slot until its turn job ends. The
        # test ends turn jobs before they start (unstarted: refunded, requeued), over and over,
        # so both dispatchers keep claiming freed slots against each other.
        deadline = asyncio.get_running_loop().time() + 40
        rounds = 0
        while rounds < 40 and asyncio.get_running_loop().time() < deadline:
            for job in jobs:
                state = await lifecycle.get(store, job.agent_job_id)
                assert state is not None
                if state.status == "running" and state.queue_job_id:
                    turn = await store.get_job(state.queue_job_id)
                    if turn is not None and turn.status == "queued":
                        await ops.cancel_queued(store, state.queue_job_id, reason="load")
                        rounds += 1
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.5)
        most, claimed = await max_running_in_the_chain(store)
        assert most == 3
        assert rounds >= 10
        assert claimed >= 3 + rounds // 2  # freed slots were claimed again, many times
        async with store.transaction() as tx:
            assert await claims.running_count(tx, agent, "org-a") == 3
    except BaseException:
        print(procs.logs())
        raise


async def test_killed_workers_mid_turn_leave_every_slot_free_once_jobs_settle(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses], tmp_path: Path
) -> None:
    store, _ = e2e_store
    registry = scripted_registry(tmp_path / "agents.yaml")
    procs = roles(
        RECEIPT_AGENTS_FILE=str(registry),
        # Lease 10 s: heartbeat every 3.3 s, Temporal redelivers after 3 s without one.
        CODEX_JOB_LEASE_MS="10000",
        RECEIPT_WORKER_LOST_TIMEOUT_MS="3000",
        RECEIPT_AGENT_JOB_RETRY_BASE_MS="200",
        RECEIPT_AGENT_JOB_REDRIVE_INTERVAL_MS="500",
    )
    procs.start("driver")
    procs.start("worker-codex-1", "worker-codex")
    try:
        jobs = [
            (await lifecycle.create(store, request("scripted", "sleep:4")))[0] for _ in range(4)
        ]
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            turns: list[Any] = []
            for job in jobs:
                state = await lifecycle.get(store, job.agent_job_id)
                if state is not None and state.queue_job_id:
                    turns.append(await store.get_job(state.queue_job_id))
            if sum(1 for t in turns if t is not None and t.status == "running") >= 3:
                break
            assert asyncio.get_running_loop().time() < deadline, "turns never started"
            await asyncio.sleep(0.1)
        procs.signal("worker-codex-1", signal.SIGKILL)
        procs.processes["worker-codex-1"].wait(10)
        procs.start("worker-codex-2", "worker-codex")
        deadline = asyncio.get_running_loop().time() + 120
        while True:
            states = [await lifecycle.get(store, j.agent_job_id) for j in jobs]
            if all(s is not None and s.terminal for s in states):
                break
            assert asyncio.get_running_loop().time() < deadline, [s and s.status for s in states]
            await asyncio.sleep(0.2)
        assert [s.status for s in states if s is not None] == ["succeeded"] * 4
        async with store.transaction() as tx:
            assert await claims.running_count(tx, "scripted", "org-a") == 0
        most, _ = await max_running_in_the_chain(store)
        assert most <= 3
    except BaseException:
        print(procs.logs())
        raise


async def test_worker_codex_meters_an_organization_s_daily_budget(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses], tmp_path: Path
) -> None:
    """`RECEIPT_GATEWAY_ORG_DAILY_BUDGET` in a real worker-codex: the organization may spend one
    call's tokens a day, so its turn's second call is refused and the job waits in `queued`
    until the next UTC midnight; the process's flush loop writes the spend to the meter."""
    store, _ = e2e_store
    providers = tmp_path / "providers.yaml"
    with running(FakeProvider({"sk-e2e": "ok"})) as fake:
        providers.write_text(
            "providers:\n"
            "  - id: test-provider\n"
            "    api: openai\n"
            f"    baseUrl: {fake.openai_url}\n"
            "    credentials: [{id: c0, env: FAKE_PROVIDER_KEY}]\n",
            encoding="utf-8",
        )
        procs = roles(
            RECEIPT_AGENTS_FILE=str(scripted_registry(tmp_path / "agents.yaml")),
            RECEIPT_PROVIDERS_FILE=str(providers),
            FAKE_PROVIDER_KEY="sk-e2e",
            RECEIPT_GATEWAY_ORG_DAILY_BUDGET=f"0,org-a={USAGE_IN + USAGE_OUT}",
        )
        procs.start("driver")
        procs.start("worker-codex")
        job, _ = await lifecycle.create(store, request("scripted", "model:2"))
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            state = await lifecycle.get(store, job.agent_job_id)
            spent, _ = await token_usage.spent_today(store, "org-a")
            if state is not None and state.turn >= 1 and state.status == "queued" and spent:
                break
            assert asyncio.get_running_loop().time() < deadline, f"still {state}, {spent}"
            await asyncio.sleep(0.2)
    now = datetime.now(UTC)
    assert state.available_at == datetime(now.year, now.month, now.day, tzinfo=UTC) + timedelta(
        days=1
    )
    assert spent == USAGE_IN + USAGE_OUT and len(fake.calls) == 1
    assert procs.logged("worker-codex", {"gateway.refused"}, reason="budget")
