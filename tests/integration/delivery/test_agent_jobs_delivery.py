"""Agent jobs end to end on a real Temporal dev server: real turns of the scripted agent
(tests/agents/scripted_agent.py) run as `agent_job.turn` queue jobs on a `receipt-codex` worker."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from activities.handlers.context import HandlerContext, HandlerError
from receipts import operations as ops
from receipts.agent_jobs import interventions, lifecycle, model
from receipts.agent_jobs.lifecycle import CreateRequest
from receipts.agent_jobs.model import AgentJob
from receipts.agent_jobs.registry import AgentJobSettings
from receipts.kinds import QUEUE_CODEX
from receipts.store import Store
from roles.delivery.agent_jobs import AgentJobDispatcher
from tests.eventually import eventually
from tests.integration.delivery.conftest import Stack, running_stack, wait_for_status
from tests.integration.helpers import put

ROOT = Path(__file__).resolve().parents[3]
AGENT = ROOT / "tests" / "agents" / "scripted_agent.py"
ORG = "org-a"


def scripted_registry(path: Path) -> Path:
    """A registry whose agent `scripted` runs tests/agents/scripted_agent.py in the sandbox
    (its source inline: the sandbox sees the system and the workspace, not this checkout)."""
    command = ["/usr/bin/python3", "-c", AGENT.read_text(encoding="utf-8")]
    path.write_text(
        "agents:\n"
        "  - id: scripted\n"
        f"    command: {json.dumps(command)}\n"
        "    soul: Patient and exact.\n"
        "    mission: Do what the prompt says.\n"
        "    skills: [testing]\n"
        "    providerBinding: test-provider\n",
        encoding="utf-8",
    )
    return path


@pytest.fixture
def agents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The registry for this test; returns where agent-job workspaces are made."""
    registry = scripted_registry(tmp_path / "agents.yaml")
    monkeypatch.setenv("RECEIPT_AGENTS_FILE", str(registry))
    return Path(os.environ["RECEIPT_WORKSPACE_ROOT"]).absolute() / "orgs" / ORG / "agent-jobs"


@contextlib.asynccontextmanager
async def stack_with_dispatcher(
    client: Client, store: Store, db_url: str, **env: str
) -> AsyncIterator[Stack]:
    async with running_stack(client, store, db_url, queues=(QUEUE_CODEX,), **env) as stack:
        # Retries 100 ms, 200 ms, … apart instead of 1 s, 2 s, … (the doubling and the 30 s cap
        # are the unit tests' subject).
        dispatcher = AgentJobDispatcher(
            store, stack.listener, AgentJobSettings(redrive_interval_ms=1_000, retry_base_ms=100)
        )
        stack.tasks.append(asyncio.create_task(dispatcher.run()))
        yield stack


def request(prompt: str, **extra: Any) -> CreateRequest:
    values: dict[str, Any] = {
        "agent_id": "scripted",
        "organization_id": ORG,
        "owner_session_id": f"session-{uuid.uuid4().hex[:8]}",
        "source_actor_event_id": "event-1",
        "source_tool_call_id": f"tool-{uuid.uuid4().hex[:8]}",
        "reply_route": {"binding": "slack", "channel": "C1", "thread": "T1"},
        "input": {"prompt": prompt},
    }
    values.update(extra)
    return CreateRequest(**values)


async def wait_for(
    store: Store, agent_job_id: str, *statuses: str, timeout: float = 60.0, turn: int | None = None
) -> AgentJob:
    job = await eventually(
        lambda: lifecycle.get(store, agent_job_id),
        lambda job: job is not None and job.status in statuses and turn in (None, job.turn),
        timeout=timeout,
        every=0.1,
        what=f"{agent_job_id} reaching {statuses}",
    )
    assert job is not None
    return job


async def test_ask_answer_succeed_with_wakeups_and_one_agents_md(
    client: Client, fresh_store: Store, fresh_db: str, agents: Path
) -> None:
    store = fresh_store
    async with stack_with_dispatcher(client, store, fresh_db):
        job, _ = await lifecycle.create(
            store, request("ask:Which branch?", workspace_template="# Project\nUse main.")
        )
        waiting = await wait_for(store, job.agent_job_id, "waiting_on_user")
        assert waiting.pending_tool_call is not None
        assert waiting.pending_tool_call.question == "Which branch?"
        agents_md = (agents / job.agent_job_id / "AGENTS.md").read_text()
        assert agents_md.startswith("# Project\nUse main.")
        assert "Patient and exact." in agents_md and "## Job Guidance" in agents_md

        await interventions.answer(store, job.agent_job_id, answer="release", tool_call_id="call-1")
        done = await wait_for(store, job.agent_job_id, "succeeded")
        assert done.result == {"answer": {"toolCallId": "call-1", "answer": "release"}}
        assert (done.attempt, done.turn) == (1, 2)

        session = await store.read_stream(model.session_stream(job.owner_session_id))
        assert [(r.type, r.data["status"], r.data["sourceId"]) for r in session] == [
            ("session.wakeup", "waiting_on_user", f"{job.agent_job_id}:waiting_on_user:1:1"),
            ("session.wakeup", "succeeded", f"{job.agent_job_id}:succeeded:1:2"),
        ]

        # A job continuing this one works in the same workspace and keeps its AGENTS.md.
        (agents / job.agent_job_id / "AGENTS.md").write_text("kept by the owner\n")
        follow, _ = await lifecycle.create(
            store, request("agents-md", continued_from_job_id=job.agent_job_id)
        )
        shown = await wait_for(store, follow.agent_job_id, "succeeded")
        assert shown.result == {"agentsMd": "kept by the owner\n"}


async def test_steer_reaches_the_running_turn_once_and_follow_up_is_the_next_turn(
    client: Client, fresh_store: Store, fresh_db: str, agents: Path
) -> None:
    store = fresh_store
    async with stack_with_dispatcher(client, store, fresh_db):
        job, _ = await lifecycle.create(store, request("steer:0"))
        running = await wait_for(store, job.agent_job_id, "running")
        assert running.queue_job_id is not None
        turn_id = running.queue_job_id
        out = await ops.add_command(
            store, turn_id, type="steer", payload={"say": "left"}, check_organization=False
        )
        assert out.ok
        done = await wait_for(store, job.agent_job_id, "succeeded")
        assert done.result["steer"]["type"] == "steer"
        assert done.result["steer"]["payload"] == {"say": "left"}
        turn_chain = await store.read_stream(f"jobs/{turn_id}")
        assert [r.type for r in turn_chain].count("queue.command.consumed") == 1

        job, _ = await lifecycle.create(store, request("sleep:3"))
        running = await wait_for(store, job.agent_job_id, "running")
        assert running.queue_job_id is not None
        await wait_for_status(store, running.queue_job_id, ("running",))
        out = await ops.add_command(
            store,
            running.queue_job_id,
            type="follow_up",
            payload="and then?",
            check_organization=False,
        )
        assert out.ok
        done = await wait_for(store, job.agent_job_id, "succeeded")
        assert (done.attempt, done.turn) == (1, 2)
        assert done.result == {"followUps": ["and then?"], "turn": 2}
        assert done.queue_job_ids == (
            f"{job.agent_job_id}:attempt:1",
            f"{job.agent_job_id}:attempt:1:turn:2",
        )


async def test_failing_turns_use_the_budget_then_fail(
    client: Client, fresh_store: Store, fresh_db: str, agents: Path
) -> None:
    store = fresh_store
    async with stack_with_dispatcher(client, store, fresh_db):
        crash, _ = await lifecycle.create(store, request("crash"))
        hard, _ = await lifecycle.create(store, request("fail-hard"))
        failed = await wait_for(store, hard.agent_job_id, "failed")
        assert failed.attempt == 1 and failed.error == "scripted fatal failure"
        failed = await wait_for(store, crash.agent_job_id, "failed", timeout=120)
        assert failed.attempt == 5 and "without an outcome line" in (failed.error or "")
        chain = await store.read_stream(model.stream_of(crash.agent_job_id))
        retries = [
            r.data for r in chain if r.type == model.TRANSITIONED and r.data["to"] == "queued"
        ]
        assert len(retries) == 4 and all(r["retryDelayMs"] <= 30_000 for r in retries)


async def test_operator_cancel_stops_a_running_job_at_once_and_its_live_turn_ends_on_its_own(
    client: Client, fresh_store: Store, fresh_db: str, agents: Path
) -> None:
    """Seed 004: the job is `stopped` at once, its live turn is not killed (its marker
    file appears), nothing is written to the job or its session after `stopped`, and another
    job of the same agent takes the freed slot. (The organization's codex cap is raised: the
    agent's slots are the subject here.)"""
    store = fresh_store
    async with stack_with_dispatcher(
        client, store, fresh_db, RECEIPT_ORG_MAX_RUNNING_PER_GROUP="10"
    ):
        # Long enough that all three are still running once each is seen running on a loaded
        # machine (with mark:4 the turn once ended before the cancel: AlreadyTerminal).
        marking, _ = await lifecycle.create(store, request("mark:8"))
        holders = [(await lifecycle.create(store, request("sleep:10")))[0] for _ in range(2)]
        waiting, _ = await lifecycle.create(store, request("done:after"))
        running = await wait_for(store, marking.agent_job_id, "running")
        for holder in holders:
            await wait_for(store, holder.agent_job_id, "running")
        assert running.queue_job_id is not None
        await wait_for_status(store, running.queue_job_id, ("running",))
        assert (await lifecycle.get(store, waiting.agent_job_id)).status == "queued"  # type: ignore[union-attr]
        # At once: stopped in the cancel's own transaction, before the live turn ends (a wall
        # clock bound measured the 2 shared cores more than the cancel: 1.3 s once in a run).
        await interventions.cancel(store, marking.agent_job_id, reason="operator")
        stopped = await lifecycle.get(store, marking.agent_job_id)
        assert stopped is not None and stopped.status == "stopped"
        assert stopped.error == "operator"
        assert (await store.get_job(running.queue_job_id)).status == "running"  # type: ignore[union-attr]
        chain = await store.read_stream(model.stream_of(marking.agent_job_id))
        # The freed slot is taken by the agent's waiting job, which runs to its end.
        done = await wait_for(store, waiting.agent_job_id, "succeeded", timeout=30)
        assert done.result == {"text": "after", "turn": 1}
        # The live turn ran to its end: its marker, its own job completed with its outcome.
        turn = await wait_for_status(store, running.queue_job_id, ("completed",), timeout=30)
        assert turn.result == {"outcome": "done", "result": {"marked": True}}
        workspace = agents / marking.agent_job_id
        assert (workspace / "marker").read_text() == "the turn ran to its end"
        # A dispatcher pass after the turn settled (the running one was woken by it too)
        # settles nothing of the stopped job: its fence holds.
        await AgentJobDispatcher(store, None, AgentJobSettings()).run_once()
        assert await store.read_stream(model.stream_of(marking.agent_job_id)) == chain
        assert await store.read_stream(model.session_stream(marking.owner_session_id)) == []
        for holder in holders:
            await interventions.cancel(store, holder.agent_job_id, reason="done with the test")


async def test_a_follow_up_sent_to_a_turn_that_asks_reaches_the_next_turn(
    client: Client, fresh_store: Store, fresh_db: str, agents: Path
) -> None:
    """A follow-up sent while a turn runs reaches the next turn whatever the turn's outcome:
    here it asks (needs_input), and the continuation after the answer is handed it."""
    store = fresh_store
    async with stack_with_dispatcher(client, store, fresh_db):
        job, _ = await lifecycle.create(store, request("slow-ask:2"))
        running = await wait_for(store, job.agent_job_id, "running")
        assert running.queue_job_id is not None
        await wait_for_status(store, running.queue_job_id, ("running",))
        sent = await ops.add_command(
            store,
            running.queue_job_id,
            type="follow_up",
            payload={"also": "check the tests"},
            organization_id=ORG,
        )
        assert sent.ok
        waiting = await wait_for(store, job.agent_job_id, "waiting_on_user")
        assert waiting.follow_up == [{"also": "check the tests"}]
        await interventions.answer(store, job.agent_job_id, answer="yes", tool_call_id="call-slow")
        done = await wait_for(store, job.agent_job_id, "succeeded")
    assert done.result == {"followUps": [{"also": "check the tests"}], "turn": 2}
    turn = await store.get_job(running.queue_job_id)
    assert turn is not None and [c.consumed_attempt for c in turn.commands] == [1]


async def test_a_turns_result_names_the_follow_ups_it_read_without_copying_them(
    client: Client, fresh_store: Store, fresh_db: str, agents: Path
) -> None:
    """A turn's result is its queue job's: in its receipts and row, every read of the job, its
    event streams, callbacks and webhooks. The follow-ups the turn read were copied into it
    whole: 10 of 60 000 characters made a 600 KB result (100 of 64 KiB, 6.4 MiB; a plug-in
    handler's result is held to 1 MiB). It names them (`followUpsRead`: their command ids); the
    settlement reads their payloads from their receipts, and the next turn is handed them."""
    store = fresh_store
    sent = [f"{i}:" + "x" * 60_000 for i in range(10)]
    async with stack_with_dispatcher(client, store, fresh_db):
        job, _ = await lifecycle.create(store, request("sleep:3"))
        running = await wait_for(store, job.agent_job_id, "running")
        assert running.queue_job_id is not None
        await wait_for_status(store, running.queue_job_id, ("running",))
        for payload in sent:
            out = await ops.add_command(
                store,
                running.queue_job_id,
                type="follow_up",
                payload=payload,
                organization_id=ORG,
            )
            assert out.ok, out.status
        done = await wait_for(store, job.agent_job_id, "succeeded")
    assert done.result == {"followUps": sent, "turn": 2}
    turn = await store.get_job(running.queue_job_id)
    assert turn is not None and turn.status == "completed"
    assert len(json.dumps(turn.result)) < 4_096, len(json.dumps(turn.result))
    assert turn.result["followUpsRead"] == [c.command_id for c in turn.commands]


async def test_a_retryable_failure_with_retry_delay_is_not_delivered_before_it(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    async def flaky(ctx: HandlerContext) -> dict[str, Any]:
        if ctx.attempt == 1:
            raise HandlerError("try later", retryable=True, retry_delay_ms=2_000)
        return {"attempt": ctx.attempt}

    store = fresh_store
    async with running_stack(
        client, store, fresh_db, queues=(QUEUE_CODEX,), handlers={"codex": flaky}
    ):
        job = (await put(store, maxAttempts=2)).job
        done = await wait_for_status(store, job.job_id, timeout=60)
        assert done.status == "completed" and done.result == {"attempt": 2}
    chain = await store.read_stream(f"jobs/{job.job_id}")
    failed = next(r for r in chain if r.type == "job.failed")
    second_lease = [r for r in chain if r.type == "job.leased"][1]
    assert failed.data["retryDelayMs"] == 2_000
    assert (second_lease.recorded_at - failed.recorded_at).total_seconds() >= 2.0


async def test_turns_run_in_the_command_sandbox(
    client: Client, fresh_store: Store, fresh_db: str, agents: Path
) -> None:
    store = fresh_store
    async with stack_with_dispatcher(client, store, fresh_db):
        job, _ = await lifecycle.create(store, request(f"whoami:{ROOT}"))
        done = await wait_for(store, job.agent_job_id, "succeeded")
    assert done.result["sees"] is False  # this checkout is outside the sandbox's view
    assert "RECEIPT_TEST_DATABASE_URL" not in done.result["env"]  # nothing of the worker's env
    assert "AGENT_JOB_ID" in done.result["env"]
