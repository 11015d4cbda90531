"""Agent-job turns calling their model through the AI gateway, on a real Temporal dev server
and the real command sandbox, against a fake provider on loopback: the turn's usage summed on
the job's chain, quota with a recovery time turned into a placement delay even though the
command crashed, a dead pool taking the ordinary retry path."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from temporalio.client import Client

from activities.gateway import Gateway
from activities.gateway_budget import Meter
from activities.gateway_providers import Budgets, Credential, Provider, Secret
from activities.handlers.agent_turn import UNSEEN_QUOTA
from receipts import token_usage
from receipts.agent_jobs import lifecycle, model
from receipts.store import Store
from tests import codex_cli
from tests.fake_provider import USAGE_IN, USAGE_OUT, FakeProvider, running
from tests.integration.delivery.test_agent_jobs_delivery import (
    ORG,
    ROOT,
    agents,
    request,
    stack_with_dispatcher,
    wait_for,
)

__all__ = ["agents"]  # the registry fixture of the scripted agent, used by name


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with running(FakeProvider({"sk-test": "ok", "sk-spent": "quota"}, quota_s=3)) as fake:
        yield fake


@contextlib.asynccontextmanager
async def gateway_for(*providers: Provider) -> AsyncIterator[Gateway]:
    async with httpx.AsyncClient() as http:
        gateway = Gateway({p.id: p for p in providers}, http)
        try:
            yield gateway
        finally:
            await gateway.close()


def openai(binding: str, fake: FakeProvider, *keys: str) -> Provider:
    credentials = tuple(Credential(f"c{n}", Secret(k), 4) for n, k in enumerate(keys))
    return Provider(binding, "openai", fake.openai_url, credentials)


async def test_a_turn_calls_its_model_through_the_gateway_and_its_usage_is_summed(
    client: Client, fresh_store: Store, fresh_db: str, agents: Path, fake: FakeProvider
) -> None:
    store = fresh_store
    async with (
        gateway_for(openai("test-provider", fake, "sk-test")) as gateway,
        stack_with_dispatcher(client, store, fresh_db, gateway=gateway),
    ):
        job, _ = await lifecycle.create(store, request("model:2", provider_binding="test-provider"))
        done = await wait_for(store, job.agent_job_id, "succeeded", "failed")
        receipts = await store.read_stream(model.stream_of(job.agent_job_id))
    assert done.status == "succeeded", done.error
    assert done.result == {"answers": ["hello", "hello"]}
    usage = [r.data for r in receipts if r.type == model.USAGE]
    assert len(usage) == 1
    assert usage[0]["calls"] == 2 and usage[0]["binding"] == "test-provider"
    assert (usage[0]["inputTokens"], usage[0]["outputTokens"]) == (2 * USAGE_IN, 2 * USAGE_OUT)
    assert usage[0]["organizationId"] == "org-a" and usage[0]["agentId"] == "scripted"
    assert done.usage == {"calls": 2, "inputTokens": 2 * USAGE_IN, "outputTokens": 2 * USAGE_OUT}
    assert [c.key for c in fake.calls] == ["sk-test", "sk-test"]
    assert gateway.grants == {}  # the turn's token was revoked when it ended


async def test_quota_with_a_recovery_time_is_a_placement_delay_though_the_command_crashed(
    client: Client, fresh_store: Store, fresh_db: str, agents: Path, fake: FakeProvider
) -> None:
    store = fresh_store
    async with (
        gateway_for(openai("test-provider", fake, "sk-spent")) as gateway,
        stack_with_dispatcher(client, store, fresh_db, gateway=gateway),
    ):
        before = datetime.now(UTC)
        job, _ = await lifecycle.create(store, request("model:1", provider_binding="test-provider"))
        delayed = await wait_for(store, job.agent_job_id, "queued", turn=1)
        fake.keys["sk-spent"] = "ok"  # the provider recovers at its reset
        done = await wait_for(store, job.agent_job_id, "succeeded", "failed", timeout=60)
        receipts = await store.read_stream(model.stream_of(job.agent_job_id))
    transitions = [r for r in receipts if r.type == model.TRANSITIONED]
    delay = next(r for r in transitions if r.data.get("reason") == "quota_delay")
    assert delay.data["refunded"] is True and delay.data["attempt"] == 0
    assert delayed.available_at is not None
    assert before + timedelta(seconds=2) <= delayed.available_at <= before + timedelta(seconds=8)
    restarted = [r for r in transitions if r.data["to"] == "running"]
    assert len(restarted) == 2 and restarted[1].recorded_at >= delayed.available_at
    assert done.status == "succeeded" and done.attempt == 1  # the delayed attempt was refunded


async def test_an_organization_s_spent_daily_budget_delays_its_job_until_the_day_renews(
    client: Client, fresh_store: Store, fresh_db: str, agents: Path, fake: FakeProvider
) -> None:
    """`RECEIPT_GATEWAY_ORG_DAILY_BUDGET`: the organization may spend one call's tokens a day;
    the turn's second call is refused and the command exits 4 — the turn settles as quota
    until the next UTC midnight, the job queued until then with its attempt refunded, and the
    first call's tokens are on the job's chain and in the organization's meter."""
    store = fresh_store
    async with (
        gateway_for(openai("test-provider", fake, "sk-test")) as gateway,
        stack_with_dispatcher(client, store, fresh_db, gateway=gateway),
    ):
        gateway.meter = Meter(store, Budgets(USAGE_IN + USAGE_OUT))
        job, _ = await lifecycle.create(store, request("model:2", provider_binding="test-provider"))
        delayed = await wait_for(store, job.agent_job_id, "queued", turn=1)
        receipts = await store.read_stream(model.stream_of(job.agent_job_id))
        await gateway.meter.flush()
        spent, _ = await token_usage.spent_today(store, ORG)
    now = datetime.now(UTC)
    midnight = datetime(now.year, now.month, now.day, tzinfo=UTC) + timedelta(days=1)
    assert delayed.available_at == midnight
    delay = next(r for r in receipts if r.data.get("reason") == "quota_delay")
    assert delay.data["refunded"] is True and delay.data["attempt"] == 0
    usage = [r.data for r in receipts if r.type == model.USAGE]
    assert [(u["calls"], u["inputTokens"]) for u in usage] == [(1, USAGE_IN)]
    assert spent == USAGE_IN + USAGE_OUT
    assert len(fake.calls) == 1


async def test_a_dead_pool_takes_the_ordinary_retry_path_naming_it(
    client: Client, fresh_store: Store, fresh_db: str, agents: Path, fake: FakeProvider
) -> None:
    store = fresh_store
    empty = Provider("test-provider", "openai", fake.openai_url, ())
    async with (
        gateway_for(empty) as gateway,
        stack_with_dispatcher(client, store, fresh_db, gateway=gateway),
    ):
        job, _ = await lifecycle.create(store, request("model:1", provider_binding="test-provider"))
        failed = await wait_for(store, job.agent_job_id, "failed", "succeeded", timeout=90)
        receipts = await store.read_stream(model.stream_of(job.agent_job_id))
    # The ordinary path: each turn a counted, retried failure, until the budget is spent.
    retried = [r for r in receipts if r.type == model.TRANSITIONED and r.data["to"] == "queued"]
    assert retried and all(r.data.get("reason") != "quota_delay" for r in retried)
    named = "model gateway: provider 'test-provider' has no usable credential"
    assert named in retried[0].data["error"]
    assert failed.status == "failed" and failed.attempt == 5
    assert fake.calls == []


async def test_a_quota_the_gateway_did_not_see_is_an_ordinary_counted_failure(
    client: Client, fresh_store: Store, fresh_db: str, agents: Path, fake: FakeProvider
) -> None:
    """Only the gateway's quota, with its recovery time, refunds an attempt: a command that
    reports `quota_exhausted` itself (here with a `retryAt` already past, which would requeue it
    at once for ever) spends an attempt like any failure."""
    store = fresh_store
    async with (
        gateway_for(openai("test-provider", fake, "sk-test")) as gateway,
        stack_with_dispatcher(client, store, fresh_db, gateway=gateway),
    ):
        job, _ = await lifecycle.create(
            store, request("quota:-60", provider_binding="test-provider")
        )
        done = await wait_for(store, job.agent_job_id, "succeeded", "failed", timeout=60)
        receipts = await store.read_stream(model.stream_of(job.agent_job_id))
    retried = [r for r in receipts if r.type == model.TRANSITIONED and r.data["to"] == "queued"]
    assert len(retried) == 1 and retried[0].data.get("reason") != "quota_delay"
    assert retried[0].data["error"] == UNSEEN_QUOTA
    assert "refunded" not in retried[0].data
    assert done.status == "succeeded" and done.attempt == 2  # the failure was counted


# --- a real coding-agent CLI -------------------------------------------------------------------

ADAPTER = ROOT / "examples" / "agents" / "codex_agent.py"


async def test_the_codex_cli_runs_an_agent_job_in_the_sandbox_through_the_gateway(
    client: Client,
    fresh_store: Store,
    fresh_db: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The agent `coder` is Codex behind the documented adapter (examples/agents/codex_agent.py):
    the fake provider's first answer calls Codex's shell tool to write a file, its second
    ends the turn. The job succeeds, the file is in its workspace, the usage is on its chain,
    and the key the provider checks is nowhere the command could see."""
    binary = await asyncio.to_thread(codex_cli.installed)
    registry = tmp_path / "agents.yaml"
    command = ["/usr/bin/python3", "-c", ADAPTER.read_text(encoding="utf-8")]
    registry.write_text(
        "agents:\n"
        "  - id: coder\n"
        f"    command: {json.dumps(command)}\n"
        "    providerBinding: test-provider\n"
        f"    env: {{CODEX_BIN: {json.dumps(str(binary))}}}\n",
        encoding="utf-8",
    )
    monkeypatch.setenv("RECEIPT_AGENTS_FILE", str(registry))
    monkeypatch.setenv("RECEIPT_SANDBOX_RO_BINDS", str(codex_cli.HOME))
    store = fresh_store
    shell = "env > seen-env.txt; echo hi > out.txt"
    with running(FakeProvider({"sk-test": "ok"}, shell_command=shell)) as fake:
        async with (
            gateway_for(openai("test-provider", fake, "sk-test")) as gateway,
            stack_with_dispatcher(client, store, fresh_db, gateway=gateway),
        ):
            coder = request("Write hi into out.txt", agent_id="coder")
            job, _ = await lifecycle.create(store, coder)
            done = await wait_for(store, job.agent_job_id, "succeeded", "failed", timeout=120)
            receipts = await store.read_stream(model.stream_of(job.agent_job_id))
            turn_receipts = await store.read_stream(f"jobs/{done.queue_job_ids[0]}")
    workspace = Path(os.environ["RECEIPT_WORKSPACE_ROOT"]) / "orgs" / ORG / "agent-jobs"
    workspace = workspace / job.agent_job_id
    assert done.status == "succeeded", (done.error, done.result)
    assert done.result["message"] == "Done: wrote out.txt"
    assert (workspace / "out.txt").read_text() == "hi\n"
    assert [c.path for c in fake.calls] == ["/v1/responses", "/v1/responses"]
    assert all(c.key == "sk-test" and c.stream for c in fake.calls)
    usage = [r.data for r in receipts if r.type == model.USAGE]
    assert [(u["calls"], u["binding"]) for u in usage] == [(2, "test-provider")]
    progress = "".join(r.data["data"]["output"] for r in turn_receipts if r.type == "job.progress")
    assert "bash -c 'env > seen-env.txt; echo hi > out.txt' (exit 0)" in progress
    seen_env = (workspace / "seen-env.txt").read_text()
    assert "OPENAI_API_KEY=" in seen_env and "sk-test" not in seen_env
    leaked = [p for p in workspace.rglob("*") if p.is_file() and b"sk-test" in p.read_bytes()]
    assert leaked == []
