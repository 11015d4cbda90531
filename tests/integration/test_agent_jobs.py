"""Agent jobs on real PostgreSQL: slots, claims, settlement, wakeups, budgets, cancel.

Turns are played by hand here (the turn's queue job is leased and settled with the fenced
operations a worker uses); tests/integration/delivery/test_agent_jobs_delivery.py runs real
turns on Temporal.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from receipts import assembly, metrics
from receipts import operations as ops
from receipts.agent_jobs import claims, interventions, lifecycle, model
from receipts.agent_jobs import reads as agent_reads
from receipts.agent_jobs.lifecycle import CreateRequest
from receipts.agent_jobs.model import AgentJob
from receipts.agent_jobs.registry import AgentJobSettings
from receipts.errors import ConflictError, InvariantError
from receipts.listen import Listener
from receipts.notices import AGENT_JOBS
from receipts.settings import Settings
from receipts.store import Draft, Store
from roles.delivery.agent_jobs import AgentJobDispatcher
from tests.eventually import eventually
from tests.integration.delivery.receiver import Receiver
from tests.integration.helpers import put

RETRY_BASE_MS = 50


def request(agent_id: str, **extra: Any) -> CreateRequest:
    values: dict[str, Any] = {
        "agent_id": agent_id,
        "organization_id": "org-a",
        "owner_session_id": f"session-{uuid.uuid4().hex[:8]}",
        "source_actor_event_id": "event-1",
        "source_tool_call_id": f"tool-{uuid.uuid4().hex[:8]}",
        "reply_route": {"binding": "slack", "channel": "C1", "thread": "T1"},
        "input": {"prompt": "work"},
    }
    values.update(extra)
    return CreateRequest(**values)


def dispatcher(store: Store) -> AgentJobDispatcher:
    return AgentJobDispatcher(store, None, AgentJobSettings(retry_base_ms=RETRY_BASE_MS))


async def play_turn(store: Store, job: AgentJob, outcome: dict[str, Any] | None) -> None:
    """Lease the job's live turn and settle it: completed with `outcome`, or failed (None)."""
    assert job.queue_job_id is not None
    worker = f"{job.queue_job_id}:attempt:1/1"
    started = await ops.start_attempt(
        store, job.queue_job_id, attempt=1, worker_id=worker, lease_ms=60_000
    )
    assert started.ok, started.status
    if outcome is None:
        out = await ops.fail(
            store,
            job.queue_job_id,
            worker_id=worker,
            attempt=1,
            error="worker died",
            retryable=True,
        )
    else:
        out = await ops.complete(
            store, job.queue_job_id, worker_id=worker, attempt=1, result=outcome
        )
    assert out.ok, out.status


async def current(store: Store, agent_job_id: str) -> AgentJob:
    job = await lifecycle.get(store, agent_job_id)
    assert job is not None
    return job


async def session_wakeups(store: Store, session_id: str) -> list[dict[str, Any]]:
    receipts = await store.read_stream(model.session_stream(session_id))
    assert all(r.type == model.WAKEUP for r in receipts)
    return [dict(r.data) for r in receipts]


async def chain_running(store: Store, agent_id: str) -> int:
    """Running jobs of an agent, folded from the receipt chain (not the projection)."""
    async with store.connection() as conn:
        cur = await conn.execute(
            "SELECT agent_job_id FROM agent_jobs WHERE agent_id = %(a)s", {"a": agent_id}
        )
        ids = [row[0] for row in await cur.fetchall()]
    count = 0
    for agent_job_id in ids:
        folded = model.fold(await store.read_stream(model.stream_of(agent_job_id)))
        assert folded is not None
        count += folded.status == "running"
    return count


async def test_four_jobs_three_run_one_waits_then_takes_a_freed_slot(
    fresh: tuple[Store, str],
) -> None:
    # A database of its own: a dispatcher pass claims every ready job, of any agent.
    store, _ = fresh
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    jobs = [(await lifecycle.create(store, request(agent)))[0] for _ in range(4)]
    passed = await dispatcher(store).run_once()
    assert passed.claimed == 3
    states = [await current(store, j.agent_job_id) for j in jobs]
    assert [s.status for s in states] == ["running", "running", "running", "queued"]
    assert await chain_running(store, agent) == 3
    # Each running job has its turn's queue job: maxAttempts 1, routed to codex.
    turn = await store.get_job(states[0].queue_job_id or "")
    assert turn is not None
    assert (turn.job_id, turn.agent_id, turn.kind, turn.max_attempts) == (
        f"{jobs[0].agent_job_id}:attempt:1",
        "codex",
        "agent_job.turn",
        1,
    )

    # One asks for input: it releases its slot and the fourth starts.
    await play_turn(
        store, states[0], {"outcome": "needs_input", "question": "which?", "toolCallId": "call-1"}
    )
    passed = await dispatcher(store).run_once()
    assert (passed.settled, passed.claimed) == (1, 1)
    waiting = await current(store, jobs[0].agent_job_id)
    assert waiting.status == "waiting_on_user"
    assert waiting.latest_status()["pendingToolCall"] == {
        "toolCallId": "call-1",
        "question": "which?",
    }
    assert (await current(store, jobs[3].agent_job_id)).status == "running"
    assert await chain_running(store, agent) == 3

    # The answer arrives while every slot is taken: recorded, not running. (It holds a float
    # `jsonb` gives back as an integer of 301 digits: the same answer again is still the same.)
    reply = {"pick": "B", "weight": 1.5e300}
    answered = await interventions.answer(
        store, waiting.agent_job_id, answer=reply, tool_call_id="call-1"
    )
    assert answered.status == "waiting_on_user" and answered.answer_pending
    assert (await dispatcher(store).run_once()).claimed == 0
    # The same answer again (a client retrying a reply it lost) is answered as it stands,
    # nothing written; another is refused as already answered (it read "is waiting_on_user,
    # not waiting for input").
    chain = await store.read_stream(model.stream_of(waiting.agent_job_id))
    again = await interventions.answer(
        store, waiting.agent_job_id, answer=reply, tool_call_id="call-1"
    )
    assert again.answer == {"toolCallId": "call-1", "answer": {**reply, "weight": 15 * 10**299}}
    assert await store.read_stream(model.stream_of(waiting.agent_job_id)) == chain
    with pytest.raises(interventions.NotWaiting, match="is already answered"):
        await interventions.answer(store, waiting.agent_job_id, answer="C", tool_call_id="call-1")

    # A slot frees: the answered job continues (turn 2 of attempt 1).
    await play_turn(store, states[1], {"outcome": "done", "result": "ok"})
    passed = await dispatcher(store).run_once()
    assert (passed.settled, passed.claimed) == (1, 1)
    resumed = await current(store, waiting.agent_job_id)
    assert (resumed.status, resumed.attempt, resumed.turn) == ("running", 1, 2)
    assert resumed.queue_job_id == f"{waiting.agent_job_id}:attempt:1:turn:2"
    assert resumed.answer == {
        "toolCallId": "call-1",
        "answer": {"pick": "B", "weight": 15 * 10**299},
    }
    assert (await current(store, jobs[1].agent_job_id)).status == "succeeded"


async def test_a_backlog_of_one_agent_never_hides_another_agents_jobs(
    fresh: tuple[Store, str],
) -> None:
    """Slots are per agent: a job whose agent has a free slot is claimed in the next pass, however
    many older jobs of another agent wait (more than a pass reads: 200)."""
    store, _ = fresh
    busy, idle = f"agent-{uuid.uuid4().hex[:6]}", f"agent-{uuid.uuid4().hex[:6]}"
    for _ in range(205):
        await lifecycle.create(store, request(busy))
    late, _ = await lifecycle.create(store, request(idle))
    passed = await dispatcher(store).run_once()
    assert passed.claimed == 4
    assert (await current(store, late.agent_job_id)).status == "running"
    assert {a: n for _, a, n in await agent_reads.running_by_agent(store)} == {busy: 3, idle: 1}
    # A full agent's jobs are not read again and again: the next pass has nothing to try.
    again = await dispatcher(store).run_once()
    assert (again.claimed, again.no_slot) == (0, 0)
    assert await agent_reads.ready(store) == []  # 202 queued, behind a full agent


async def test_each_organization_has_its_three_slots_of_an_agent(
    fresh: tuple[Store, str],
) -> None:
    """Agents are the deployment's (one registry); each organization's use of one has its three
    slots: one tenant's three long jobs held the agent's only three, and another tenant's job
    waited queued for as long as they ran."""
    store, _ = fresh
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    for _ in range(4):
        await lifecycle.create(store, request(agent))
    first = await dispatcher(store).run_once()
    assert first.claimed == 3  # org-a's three; its fourth waits
    other, _ = await lifecycle.create(store, request(agent, organization_id="org-b"))
    second = await dispatcher(store).run_once()
    assert second.claimed == 1
    assert (await current(store, other.agent_job_id)).status == "running"
    async with store.transaction() as tx:
        assert await claims.running_count(tx, agent, "org-a") == 3
        assert await claims.running_count(tx, agent, "org-b") == 1
    assert await agent_reads.running_by_agent(store) == [("org-a", agent, 3), ("org-b", agent, 1)]


async def test_a_live_delivery_to_the_owner_session_is_not_a_steer_of_its_job(
    fresh: tuple[Store, str],
) -> None:
    """The spec: the dispatch path treats steer events separately, so a live delivery to the
    session is not mistaken for a job steer. A turn's queue job has no session key: a steer-lane
    job posted on the owner session's id (to the turn's own agent) is a job of its own, and the
    running turn receives nothing; only a command to the turn's queue job steers it."""
    store, _ = fresh
    created, _ = await lifecycle.create(store, request(f"agent-{uuid.uuid4().hex[:6]}"))
    assert (await dispatcher(store).run_once()).claimed == 1
    job = await current(store, created.agent_job_id)
    assert job.status == "running" and job.queue_job_id is not None
    turn = await store.get_job(job.queue_job_id)
    assert turn is not None and turn.session_key is None
    worker = f"{job.queue_job_id}:attempt:1/1"
    assert (
        await ops.start_attempt(
            store, job.queue_job_id, attempt=1, worker_id=worker, lease_ms=60_000
        )
    ).ok
    delivered = await put(
        store,
        agent="codex",
        lane="steer",
        sessionKey=job.owner_session_id,
        singletonMode="steer",
    )
    assert delivered.created and delivered.job.job_id != job.queue_job_id
    after = await store.get_job(job.queue_job_id)
    assert after is not None and after.commands == () and after.pending_commands == ()


async def test_concurrent_claimers_never_exceed_three(store: Store) -> None:
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    jobs = [(await lifecycle.create(store, request(agent)))[0] for _ in range(12)]
    # Every claim races every other one, each in its own transaction on its own connection.
    results = await asyncio.gather(
        *(claims.claim_attempt(store, j.agent_job_id, agent) for j in jobs for _ in range(2))
    )
    assert sum(isinstance(r, model.AgentJob) for r in results) == 3
    assert await chain_running(store, agent) == 3
    # And whole dispatcher passes racing each other.
    await asyncio.gather(*(dispatcher(store).run_once() for _ in range(4)))
    assert await chain_running(store, agent) == 3


async def test_concurrent_claimers_of_two_organizations_never_exceed_three_each(
    store: Store,
) -> None:
    """The spec's slot lock, then the job row, under a lock per agent and organization: claims
    of two organizations' jobs for one agent race each other (each twice, each on its own
    connection, and whole passes too) and each organization runs exactly three — one's claims
    neither take the other's slots nor wait its lock out."""
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    jobs = [
        (await lifecycle.create(store, request(agent, organization_id=org)))[0]
        for org in ("org-a", "org-b")
        for _ in range(6)
    ]
    results = await asyncio.gather(
        *(claims.claim_attempt(store, j.agent_job_id, agent) for j in jobs for _ in range(2))
    )
    assert sum(isinstance(r, model.AgentJob) for r in results) == 6
    await asyncio.gather(*(dispatcher(store).run_once() for _ in range(4)))
    async with store.transaction() as tx:
        for org in ("org-a", "org-b"):
            assert await claims.running_count(tx, agent, org) == 3
    assert await chain_running(store, agent) == 6


async def test_wakeups_once_per_status_attempt_turn_in_the_transition(store: Store) -> None:
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    job, _ = await lifecycle.create(store, request(agent))
    assert await session_wakeups(store, job.owner_session_id) == []  # none for queued
    await dispatcher(store).run_once()
    assert await session_wakeups(store, job.owner_session_id) == []  # none for running
    running = await current(store, job.agent_job_id)
    await play_turn(store, running, {"outcome": "needs_input", "question": "q", "toolCallId": "c1"})

    # An injected failure after the transition's append: the transaction leaves neither.
    with pytest.raises(RuntimeError, match="injected"):
        async with store.transaction() as tx:
            moved = await lifecycle.settle_turn_in(tx, job.agent_job_id, retry_base_ms=10)
            assert moved is not None and moved.status == "waiting_on_user"
            raise RuntimeError("injected after the append")
    assert (await current(store, job.agent_job_id)).status == "running"
    assert await session_wakeups(store, job.owner_session_id) == []
    chain = await store.read_stream(model.stream_of(job.agent_job_id))
    assert [r.type for r in chain][-1] == model.TRANSITIONED
    assert chain[-1].data["to"] == "running"

    # The real settlement writes both, and running it again writes nothing more.
    for _ in range(3):
        await lifecycle.settle_turn(store, job.agent_job_id, retry_base_ms=10)
    wakeups = await session_wakeups(store, job.owner_session_id)
    assert [w["sourceId"] for w in wakeups] == [f"{job.agent_job_id}:waiting_on_user:1:1"]
    assert wakeups[0]["replyRoute"] == {"binding": "slack", "channel": "C1", "thread": "T1"}
    assert wakeups[0]["latestStatus"]["errorCode"] == "request_user_input"

    # The wakeup and the transition are in one transaction: same database time.
    chain = await store.read_stream(model.stream_of(job.agent_job_id))
    session = await store.read_stream(model.session_stream(job.owner_session_id))
    assert chain[-1].recorded_at == session[0].recorded_at

    # Answer, continue, succeed: a second wakeup with its own source id; stop gets none.
    await interventions.answer(store, job.agent_job_id, answer=1, tool_call_id=None)
    await dispatcher(store).run_once()  # the continuation is claimed
    await play_turn(store, await current(store, job.agent_job_id), {"outcome": "done", "result": 2})
    await dispatcher(store).run_once()
    wakeups = await session_wakeups(store, job.owner_session_id)
    assert [w["sourceId"] for w in wakeups] == [
        f"{job.agent_job_id}:waiting_on_user:1:1",
        f"{job.agent_job_id}:succeeded:1:2",
    ]
    assert wakeups[1]["result"] == 2

    # A replayed wakeup (the same source id again) is refused by the table's key, not duplicated.
    async with store.transaction() as tx:
        changed = await tx.execute(
            "agent_wakeup_record",
            {
                "source_id": wakeups[1]["sourceId"],
                "agent_job_id": job.agent_job_id,
                "session_id": job.owner_session_id,
                "session_seq": 99,
            },
        )
    assert changed == 0


async def test_no_sixth_attempt_and_bounded_retry_delays(store: Store) -> None:
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    job, _ = await lifecycle.create(store, request(agent))
    attempts_seen: list[int] = []
    for _ in range(10):
        await dispatcher(store).run_once()
        state = await current(store, job.agent_job_id)
        if state.terminal:
            break
        if state.status == "queued":
            assert state.available_at is not None
            delay = (state.available_at - state.updated_at).total_seconds()
            assert 0 <= delay <= 30
            await asyncio.sleep(max(delay, 0) + 0.05)
            continue
        attempts_seen.append(state.attempt)
        await play_turn(store, state, None)  # the turn's queue job failed (a dead worker)
        await dispatcher(store).run_once()
    final = await current(store, job.agent_job_id)
    assert final.status == "failed"
    assert attempts_seen == [1, 2, 3, 4, 5]
    assert final.error is not None and "turn failed" in final.error
    chain = await store.read_stream(model.stream_of(job.agent_job_id))
    claims = [r for r in chain if r.type == model.TRANSITIONED and r.data["to"] == "running"]
    assert len(claims) == 5
    wakeups = await session_wakeups(store, job.owner_session_id)
    assert [w["status"] for w in wakeups] == ["failed"]


async def test_quota_delay_refunds_and_waits_until_retry_at(store: Store) -> None:
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    job, _ = await lifecycle.create(store, request(agent))
    await dispatcher(store).run_once()
    running = await current(store, job.agent_job_id)
    retry_at = await store.now() + timedelta(seconds=1.5)
    await play_turn(store, running, {"outcome": "quota_exhausted", "retryAt": retry_at.isoformat()})
    await dispatcher(store).run_once()
    delayed = await current(store, job.agent_job_id)
    assert (delayed.status, delayed.attempt, delayed.consecutive_failures) == ("queued", 0, 0)
    assert delayed.available_at == retry_at
    assert delayed.started_at is None  # the first attempt was refunded: a fresh start
    assert (await dispatcher(store).run_once()).claimed == 0  # not before retryAt
    await asyncio.sleep(max(0.0, (retry_at - await store.now()).total_seconds()) + 0.05)
    assert (await dispatcher(store).run_once()).claimed == 1
    again = await current(store, job.agent_job_id)
    assert (again.status, again.attempt, again.turn) == ("running", 1, 2)
    assert again.queue_job_id == f"{job.agent_job_id}:attempt:1:turn:2"


async def test_an_unstarted_attempt_is_refunded(store: Store) -> None:
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    job, _ = await lifecycle.create(store, request(agent))
    await dispatcher(store).run_once()
    running = await current(store, job.agent_job_id)
    assert running.queue_job_id is not None
    out = await ops.cancel_queued(store, running.queue_job_id, reason="never delivered")
    assert out.ok
    await dispatcher(store).run_once()  # settles as unstarted, then claims attempt 1 again
    again = await current(store, job.agent_job_id)
    assert (again.status, again.attempt) == ("running", 1)
    assert again.queue_job_id == f"{job.agent_job_id}:attempt:1:turn:2"


async def test_cancel_of_a_running_job_stops_it_at_once_and_leaves_its_turn_alone(
    store: Store,
) -> None:
    """Seed 004: cancel drives the job to `stopped` and does not yank a live worker out from
    under a running turn; the turn finishes on its own, fenced: nothing of its end is written."""
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    jobs = [(await lifecycle.create(store, request(agent)))[0] for _ in range(4)]
    await dispatcher(store).run_once()
    first = await current(store, jobs[0].agent_job_id)
    assert first.queue_job_id is not None
    worker = f"{first.queue_job_id}:attempt:1/1"
    assert (
        await ops.start_attempt(
            store, first.queue_job_id, attempt=1, worker_id=worker, lease_ms=60_000
        )
    ).ok
    stopped = await interventions.cancel(store, first.agent_job_id, reason="operator")
    assert (stopped.status, stopped.error) == ("stopped", "operator")
    chain = await store.read_stream(model.stream_of(first.agent_job_id))
    assert chain[-1].data["liveTurnJobId"] == first.queue_job_id
    turn = await store.get_job(first.queue_job_id)
    assert turn is not None and turn.status == "running" and not turn.abort_requested
    # While that turn runs, no job may continue the stopped one in its workspace.
    with pytest.raises(lifecycle.LiveTurnRunning):
        await lifecycle.create(store, request(agent, continued_from_job_id=first.agent_job_id))
    # The slot is free at once: the fourth job is claimed while the turn still runs.
    assert (await dispatcher(store).run_once()).claimed == 1
    assert (await current(store, jobs[3].agent_job_id)).status == "running"
    # The turn ends on its own, with an outcome that would succeed the job: nothing is written.
    done = {"outcome": "done", "result": {"late": True}}
    assert (
        await ops.complete(store, first.queue_job_id, worker_id=worker, attempt=1, result=done)
    ).ok
    assert (await dispatcher(store).run_once()).settled == 0
    assert await store.read_stream(model.stream_of(first.agent_job_id)) == chain
    assert await session_wakeups(store, first.owner_session_id) == []
    # A job continuing the stopped one would share its workspace with the turn still running:
    # refused until that turn has ended (here it has: it completed above).
    continued, _ = await lifecycle.create(
        store, request(agent, continued_from_job_id=first.agent_job_id)
    )
    assert continued.workspace_owner_job_id == first.agent_job_id
    # A running job whose turn has not started yet: the turn is canceled with it.
    second = await current(store, jobs[1].agent_job_id)
    assert second.queue_job_id is not None
    assert (await interventions.cancel(store, second.agent_job_id, reason="x")).status == "stopped"
    unstarted = await store.get_job(second.queue_job_id)
    assert unstarted is not None and unstarted.status == "canceled"
    # A queued job stops at once; a stopped one takes nothing more.
    queued = (await lifecycle.create(store, request(agent)))[0]
    assert (await interventions.cancel(store, queued.agent_job_id, reason="x")).status == "stopped"
    with pytest.raises(interventions.AlreadyTerminal):
        await interventions.cancel(store, queued.agent_job_id, reason="again")


def event_count(event: str) -> float:
    return metrics.value("receipt_agent_job_events_total", event=event)


async def test_input_timeout_fails_a_waiting_job(store: Store) -> None:
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    before = {e: event_count(e) for e in ("created", "wakeup", "input_timeout")}
    job, _ = await lifecycle.create(store, request(agent))
    assert event_count("created") == before["created"] + 1
    await dispatcher(store).run_once()
    await play_turn(
        store,
        await current(store, job.agent_job_id),
        {"outcome": "needs_input", "question": "q", "toolCallId": "c"},
    )
    await dispatcher(store).run_once()
    await asyncio.sleep(0.3)
    timed = AgentJobDispatcher(store, None, AgentJobSettings(input_timeout_ms=200))
    # At least this one: the pass sees every waiting job of the shared database, and another
    # test's job left waiting past 200 ms times out in the same pass.
    assert (await timed.run_once()).timed_out >= 1
    final = await current(store, job.agent_job_id)
    assert final.status == "failed" and "no answer within 200 ms" in (final.error or "")
    assert [w["status"] for w in await session_wakeups(store, job.owner_session_id)] == [
        "waiting_on_user",
        "failed",
    ]
    # Counted, each (a timeout logged agent_job.input_timeout too: it logged nothing).
    assert event_count("input_timeout") >= before["input_timeout"] + 1
    assert event_count("wakeup") >= before["wakeup"] + 2


async def test_sessions_belong_to_one_organization_and_creates_are_idempotent(store: Store) -> None:
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    first = request(agent)
    job, created = await lifecycle.create(store, first)
    again, created_again = await lifecycle.create(store, first)
    assert created and not created_again and again.agent_job_id == job.agent_job_id
    with pytest.raises(ConflictError, match="another organization"):
        await lifecycle.create(
            store, request(agent, organization_id="org-b", owner_session_id=first.owner_session_id)
        )
    # A continued job reuses the workspace of the job it continues, once that one has finished.
    with pytest.raises(lifecycle.LiveTurnRunning, match="has not finished \\(status queued\\)"):
        await lifecycle.create(store, request(agent, continued_from_job_id=job.agent_job_id))
    await interventions.cancel(store, job.agent_job_id, reason="handed on")
    follow = await lifecycle.create(store, request(agent, continued_from_job_id=job.agent_job_id))
    assert follow[0].workspace_owner_job_id == job.agent_job_id


async def test_one_workspace_is_handed_forward_to_one_job_at_a_time(store: Store) -> None:
    """Two turns never run in one workspace: a continuation is refused while any job of the
    workspace (the one it continues, or another continuing it) is unfinished, and of continuations
    racing for a finished job's workspace exactly one is created."""
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    first, _ = await lifecycle.create(store, request(agent))
    await interventions.cancel(store, first.agent_job_id, reason="done with it")
    racing = await asyncio.gather(
        *(
            lifecycle.create(store, request(agent, continued_from_job_id=first.agent_job_id))
            for _ in range(4)
        ),
        return_exceptions=True,
    )
    created = [r for r in racing if isinstance(r, tuple)]
    assert len(created) == 1
    assert all(isinstance(r, lifecycle.LiveTurnRunning) for r in racing if r not in created)
    second = created[0][0]
    # Continuing the first again, or the second, is refused while the second is unfinished.
    for earlier in (first, second):
        with pytest.raises(lifecycle.LiveTurnRunning, match=second.agent_job_id):
            await lifecycle.create(
                store, request(agent, continued_from_job_id=earlier.agent_job_id)
            )
    await interventions.cancel(store, second.agent_job_id, reason="done with it too")
    third, _ = await lifecycle.create(
        store, request(agent, continued_from_job_id=second.agent_job_id)
    )
    assert third.workspace_owner_job_id == first.agent_job_id


async def test_a_refused_transition_writes_nothing(store: Store) -> None:
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    job, _ = await lifecycle.create(store, request(agent))
    with pytest.raises(InvariantError, match="queued -> succeeded"):
        async with store.transaction() as tx:
            locked = await lifecycle.job_for_update(tx, job.agent_job_id)
            await lifecycle.append(
                tx, locked, [Draft(model.TRANSITIONED, {"from": "queued", "to": "succeeded"})]
            )
    assert len(await store.read_stream(model.stream_of(job.agent_job_id))) == 1


async def test_the_projection_is_the_fold_of_the_chain_and_rebuilds(store: Store) -> None:
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    jobs = [(await lifecycle.create(store, request(agent)))[0] for _ in range(4)]
    await dispatcher(store).run_once()
    await play_turn(
        store,
        await current(store, jobs[0].agent_job_id),
        {"outcome": "needs_input", "question": "q", "toolCallId": "c"},
    )
    await interventions.cancel(store, jobs[3].agent_job_id, reason="x")
    await dispatcher(store).run_once()
    assert await assembly.verify(store) == []
    async with store.connection() as conn:
        await conn.execute(
            "UPDATE agent_jobs SET state = jsonb_set(state, '{turn}', '7') "
            "WHERE agent_job_id = %(id)s",
            {"id": jobs[1].agent_job_id},
        )
    assert await assembly.verify(store) == [
        f"agent job {jobs[1].agent_job_id}: projection differs from the fold of its chain"
    ]
    await assembly.rebuild(store)
    assert await assembly.verify(store) == []
    assert (await current(store, jobs[1].agent_job_id)).turn == 1


async def test_wakeups_are_posted_to_the_event_callback_once(store: Store) -> None:
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    job, _ = await lifecycle.create(store, request(agent))
    async with Receiver() as receiver, httpx.AsyncClient() as http:
        settings = Settings(
            RECEIPT_EVENT_CALLBACK_URL=receiver.url, RECEIPT_CALLBACK_SIGNING_SECRET="s3cret"
        )
        posting = AgentJobDispatcher(store, None, AgentJobSettings(), callbacks=settings, http=http)
        await posting.run_once()
        await play_turn(
            store,
            await current(store, job.agent_job_id),
            {"outcome": "needs_input", "question": "q", "toolCallId": "c"},
        )
        await posting.run_once()
        await posting.run_once()  # a second pass posts nothing again
        mine = [r for r in receiver.requests if job.agent_job_id in r.body.decode()]
        assert len(mine) == 1
        body = json.loads(mine[0].body)
        assert body["event"] == "session.wakeup" and body["sessionId"] == job.owner_session_id
        assert body["wakeup"]["data"]["sourceId"] == f"{job.agent_job_id}:waiting_on_user:1:1"
        assert Receiver.verify(mine[0], b"s3cret")


async def test_a_wakeup_receiver_that_never_answers_holds_back_no_pass(
    fresh: tuple[Store, str],
) -> None:
    """Wakeups were posted one by one inside the pass, 5 s each: a receiver that accepts and
    never answers held every pass (three wakeups: 15 s) and with it every tenant's claims. The
    posts run beside the pass, which waits for them a second at most; a job waiting behind them
    is claimed at once, and the posts still running stop with the dispatcher."""
    store, _ = fresh

    handlers: set[asyncio.Task[Any]] = set()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.add(asyncio.current_task())  # type: ignore[arg-type]
        try:
            await reader.read()  # never answers; returns when the client hangs up
        finally:
            writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    asking = [(await lifecycle.create(store, request(agent)))[0] for _ in range(3)]
    await dispatcher(store).run_once()
    for job in asking:
        await play_turn(
            store,
            await current(store, job.agent_job_id),
            {"outcome": "needs_input", "question": "q", "toolCallId": "c"},
        )
    late, _ = await lifecycle.create(store, request(agent))  # a slot is free again
    async with server, httpx.AsyncClient() as http:
        settings = Settings(RECEIPT_EVENT_CALLBACK_URL=f"http://127.0.0.1:{port}/hook")
        posting = AgentJobDispatcher(store, None, AgentJobSettings(), callbacks=settings, http=http)
        started = time.monotonic()
        passed = await posting.run_once()
        took = time.monotonic() - started
        assert passed.claimed == 1 and passed.callbacks == 0
        assert took < 4.0, took  # 15 s and more before
        assert (await current(store, late.agent_job_id)).status == "running"
        again = await posting.run_once()  # the posts in flight are not started twice
        assert again.callbacks == 0 and len(posting._posting) == 3
        await posting.close()
        assert posting._posting == {}
    for handler in handlers:
        handler.cancel()
    await asyncio.gather(*handlers, return_exceptions=True)


async def test_a_jobs_wakeups_are_read_by_their_rows_not_by_its_sessions_stream(
    store: Store,
) -> None:
    """The console's job detail read the owner's whole session stream (one read: 10 000
    receipts) and filtered it: a long-lived session's newer jobs showed no wakeups. They are
    read by the wakeup rows that name them: this job's, not another's of the same session."""
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    session = f"session-{uuid.uuid4().hex[:8]}"
    mine, _ = await lifecycle.create(store, request(agent, owner_session_id=session))
    other, _ = await lifecycle.create(store, request(agent, owner_session_id=session))
    await dispatcher(store).run_once()
    for job in (mine, other):
        await play_turn(
            store,
            await current(store, job.agent_job_id),
            {"outcome": "needs_input", "question": "q", "toolCallId": "c"},
        )
    await dispatcher(store).run_once()
    [wakeup] = await agent_reads.wakeups_of(store, mine.agent_job_id)
    assert wakeup.type == model.WAKEUP and wakeup.data["agentJobId"] == mine.agent_job_id
    assert wakeup.stream == model.session_stream(mine.owner_session_id)


async def test_other_work_neither_queries_for_nor_puts_off_the_next_pass(
    store: Store, db_url: str
) -> None:
    """Every append anywhere reaches the dispatcher as a notice. Those of other work (plain
    jobs here, one every 20 ms) cost it nothing: the time of its next pass is read once per
    pass, not once per notice, and the periodic pass still comes at its interval."""

    class Counting(AgentJobDispatcher):
        passes = 0
        timeouts = 0

        async def run_once(self) -> Any:
            Counting.passes += 1
            return await super().run_once()

        async def _timeout(self) -> float:
            Counting.timeouts += 1
            return await super()._timeout()

    listener = Listener(db_url, always=[AGENT_JOBS])
    listening = asyncio.create_task(listener.run())
    await asyncio.wait_for(listener.connected.wait(), 10)
    counting = Counting(store, listener, AgentJobSettings(redrive_interval_ms=300))
    running = asyncio.create_task(counting.run())
    try:
        for _ in range(50):  # 1 s of other work
            await put(store)
            await asyncio.sleep(0.02)
    finally:
        running.cancel()
        listening.cancel()
        await asyncio.gather(running, listening, return_exceptions=True)
    assert Counting.passes >= 3  # the first, then one every 300 ms
    assert Counting.timeouts <= Counting.passes


async def test_a_job_is_claimed_only_when_its_turn_can_take_its_organizations_codex_slot(
    fresh: tuple[Store, str],
) -> None:
    """Slots and caps agree: a job never shows `running` holding one of its agent's slots while
    its turn waits behind its organization's share of the codex workers
    (`RECEIPT_ORG_MAX_RUNNING_PER_GROUP`); the claim takes that share for the turn, so the
    starter finds it held, and it is given back when the turn settles."""
    store, _ = fresh
    from receipts import fairness
    from receipts.kinds import QUEUE_CODEX

    capped = AgentJobDispatcher(store, None, AgentJobSettings(), org_cap=1)
    task = (await put(store, org="org-a", payload_extra={"task": {"command": ["true"]}})).job
    taken = await fairness.claim(store, task, await store.now(), QUEUE_CODEX, 1)
    assert taken.step.name == "DELIVER"  # the organization's one codex slot is the task's
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    job, _ = await lifecycle.create(store, request(agent))
    held = await capped.run_once()
    assert (held.claimed, held.held) == (0, 1)
    assert (await current(store, job.agent_job_id)).status == "queued"  # no agent slot held
    assert await agent_reads.running_by_agent(store) == []
    assert capped.holding  # any job's settlement now wakes the dispatcher
    # The task settles and gives its slot back: the next pass claims the job, whose turn holds
    # the organization's slot from the claim on.
    worker = f"{task.job_id}:attempt:1/1"
    assert (
        await ops.start_attempt(store, task.job_id, attempt=1, worker_id=worker, lease_ms=60_000)
    ).ok
    assert (await ops.complete(store, task.job_id, worker_id=worker, attempt=1, result={})).ok
    claimed = await capped.run_once()
    assert (claimed.claimed, claimed.held) == (1, 0) and not capped.holding
    running = await current(store, job.agent_job_id)
    assert running.status == "running" and running.queue_job_id is not None
    turn = await store.get_job(running.queue_job_id)
    assert turn is not None
    mine = await fairness.claim(store, turn, await store.now(), QUEUE_CODEX, 1)
    assert mine.step.name == "DELIVER"  # the starter finds the turn holding the slot
    other = (await put(store, org="org-a", payload_extra={"task": {"command": ["true"]}})).job
    blocked = await fairness.claim(store, other, await store.now(), QUEUE_CODEX, 1)
    assert blocked.step.name == "HELD"


async def test_a_next_turn_that_cannot_take_its_organizations_slot_requeues_the_job(
    fresh: tuple[Store, str], tmp_path: Path
) -> None:
    """A `done` turn with follow-ups continues in a next turn, which needs its organization's
    share of the codex workers like a claimed one: without a free slot the job goes back to
    `queued` (attempt refunded, follow-ups carried) instead of holding its agent's slot while
    the turn waits, and runs the same attempt again once a slot frees."""
    store, _ = fresh
    from receipts import fairness
    from receipts.kinds import QUEUE_CODEX

    agent = f"agent-{uuid.uuid4().hex[:6]}"
    registry = tmp_path / "agents.yaml"  # the gauge names the registry's agents
    registry.write_text(f'agents:\n  - id: {agent}\n    command: ["true"]\n', "utf-8")
    settings = AgentJobSettings(RECEIPT_AGENTS_FILE=str(registry))
    capped = AgentJobDispatcher(store, None, settings, org_cap=1)
    job, _ = await lifecycle.create(store, request(agent))
    assert (await capped.run_once()).claimed == 1
    assert metrics.value("receipt_agent_jobs_running", agent=agent) == 1
    running = await current(store, job.agent_job_id)
    # Another codex job of the organization takes the slot the moment the turn gives it back.
    await play_turn(store, running, {"outcome": "done", "result": 1, "followUps": ["more"]})
    task = (await put(store, org="org-a", payload_extra={"task": {"command": ["true"]}})).job
    assert (await fairness.claim(store, task, await store.now(), QUEUE_CODEX, 1)).step.name == (
        "DELIVER"
    )
    held = await capped.run_once()
    assert held.settled == 1
    requeued = await current(store, job.agent_job_id)
    assert (requeued.status, requeued.attempt, requeued.follow_up) == ("queued", 0, ["more"])
    chain = await store.read_stream(model.stream_of(job.agent_job_id))
    assert chain[-1].data["reason"] == "organization_at_cap"
    assert await agent_reads.running_by_agent(store) == []
    assert metrics.value("receipt_agent_jobs_running", agent=agent) == 0  # not its last count
    # The task settles: the same attempt runs again, its turn handed the follow-up.
    worker = f"{task.job_id}:attempt:1/1"
    assert (
        await ops.start_attempt(store, task.job_id, attempt=1, worker_id=worker, lease_ms=60_000)
    ).ok
    assert (await ops.complete(store, task.job_id, worker_id=worker, attempt=1, result={})).ok
    assert (await capped.run_once()).claimed == 1
    again = await current(store, job.agent_job_id)
    assert (again.status, again.attempt, again.turn) == ("running", 1, 2)
    assert again.queue_job_id == f"{job.agent_job_id}:attempt:1:turn:2"


async def test_the_running_gauge_names_the_registrys_agents_only(
    fresh: tuple[Store, str], tmp_path: Path
) -> None:
    """`receipt_agent_jobs_running{agent}`: a tenant chooses an agent job's `agentId` (the api
    checks it only where it reads the registry), and each label value is a series on every
    scrape, kept at 0 once it ran. 20 agent ids no registry names were 20 series (one per id,
    for good); an agent the registry does not name is counted as `other`."""
    store, _ = fresh
    registered = f"agent-{uuid.uuid4().hex[:6]}"
    registry = tmp_path / "agents.yaml"
    registry.write_text(f'agents:\n  - id: {registered}\n    command: ["true"]\n', "utf-8")
    chosen = [f"tenant-{uuid.uuid4().hex[:6]}-{i}" for i in range(20)]
    for agent in (registered, *chosen):
        await lifecycle.create(store, request(agent))
    settings = AgentJobSettings(RECEIPT_AGENTS_FILE=str(registry))
    assert (await AgentJobDispatcher(store, None, settings).run_once()).claimed == 21
    labels = {
        sample.labels["agent"]
        for family in REGISTRY.collect()
        if family.name == "receipt_agent_jobs_running"
        for sample in family.samples
    }
    assert labels.isdisjoint(chosen)
    assert metrics.value("receipt_agent_jobs_running", agent=registered) == 1
    assert metrics.value("receipt_agent_jobs_running", agent="other") == 20


@pytest.mark.parametrize("ending", ["failed", "lease_expired"])
async def test_a_follow_up_a_turn_read_before_its_worker_died_reaches_the_next_turn(
    store: Store, ending: str
) -> None:
    """A turn read its follow-up (consumed) and its worker died before the turn ended: no
    outcome records it, and being consumed it was not among the unread ones either — lost."""
    job, _ = await lifecycle.create(store, request(f"agent-{uuid.uuid4().hex[:6]}"))
    agent_dispatcher = dispatcher(store)
    await agent_dispatcher.run_once()
    job = await current(store, job.agent_job_id)
    turn = job.queue_job_id
    assert turn is not None
    worker = f"{turn}:attempt:1/1"
    lease_ms = 60_000 if ending == "failed" else 200
    assert (await ops.start_attempt(store, turn, attempt=1, worker_id=worker, lease_ms=lease_ms)).ok
    added = await ops.add_command(
        store,
        turn,
        type="follow_up",
        payload={"msg": "also do X"},
        organization_id="org-a",
        command_id="fu-1",
    )
    assert added.ok, added.status
    read = await ops.consume_command(store, turn, worker_id=worker, attempt=1, command_id="fu-1")
    assert read.ok
    if ending == "failed":
        died = await ops.fail(
            store, turn, worker_id=worker, attempt=1, error="lost", retryable=True
        )
        assert died.ok, died.status
    else:
        await asyncio.sleep(0.4)
        assert (await ops.expire_lease(store, turn)).ok
    await agent_dispatcher.run_once()
    chain = await store.read_stream(model.stream_of(job.agent_job_id))
    # The requeue (the same pass may start the next turn after it).
    moved = [r.data for r in chain if r.type == model.TRANSITIONED and r.data["to"] == "queued"]
    assert moved[-1]["followUps"] == [{"msg": "also do X"}], moved


async def test_a_failed_dispatch_pass_is_counted(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass that raised was logged only: `receipt_loop_failed_passes{loop=…}` counts it, so
    ReceiptRecoveryLoopFailing sees a dispatcher that keeps failing."""
    agent_dispatcher = dispatcher(store)

    async def database_away() -> Any:
        raise RuntimeError("database away")

    monkeypatch.setattr(agent_dispatcher, "run_once", database_away)
    before = metrics.value("receipt_loop_failed_passes_total", loop="agent_job_dispatcher")
    await agent_dispatcher._pass()
    after = metrics.value("receipt_loop_failed_passes_total", loop="agent_job_dispatcher")
    assert after == before + 1


async def test_a_quota_delay_after_a_turn_that_ran_keeps_the_jobs_start(store: Store) -> None:
    """Turn 1 asked, the answer's turn met a quota delay: the attempt is refunded, but the
    job ran; it showed `attempt 0, startedAt None`, as if it never had."""
    job, _ = await lifecycle.create(store, request(f"agent-{uuid.uuid4().hex[:6]}"))
    await dispatcher(store).run_once()
    asked = {"outcome": "needs_input", "question": "which?", "toolCallId": "c1"}
    await play_turn(store, await current(store, job.agent_job_id), asked)
    await dispatcher(store).run_once()
    await interventions.answer(store, job.agent_job_id, answer="main", tool_call_id="c1")
    await dispatcher(store).run_once()
    continued = await current(store, job.agent_job_id)
    assert continued.status == "running" and continued.turn == 2
    started_at = continued.started_at
    retry_at = (await store.now() + timedelta(seconds=60)).isoformat()
    await play_turn(store, continued, {"outcome": "quota_exhausted", "retryAt": retry_at})
    await dispatcher(store).run_once()
    delayed = await current(store, job.agent_job_id)
    assert (delayed.status, delayed.attempt) == ("queued", 0)
    assert delayed.started_at == started_at and started_at is not None


async def test_a_turn_that_fails_before_its_command_runs_logs_its_outcome(
    store: Store, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A missing agents registry (or agent, workspace, sandbox refusal) failed the turn with
    no log line at all: only a turn whose command ran logged `agent_turn.outcome`."""
    from activities.handlers.agent_turn import run_agent_turn
    from activities.handlers.context import HandlerSettings
    from tests.integration.helpers import started_context

    job, _ = await lifecycle.create(store, request(f"agent-{uuid.uuid4().hex[:6]}"))
    await dispatcher(store).run_once()
    turn = (await current(store, job.agent_job_id)).queue_job_id
    assert turn is not None
    missing = AgentJobSettings(RECEIPT_AGENTS_FILE=str(tmp_path / "no-agents.yaml"))
    ctx = await started_context(store, turn, HandlerSettings(agent_jobs=missing))
    outcome = await run_agent_turn(ctx)
    assert outcome["outcome"] == "failed"
    logged = [r for r in caplog.records if getattr(r, "event", None) == "agent_turn.outcome"]
    assert logged and logged[0].agentJobId == job.agent_job_id  # type: ignore[attr-defined]
    assert logged[0].error == outcome["error"]  # type: ignore[attr-defined]


async def test_a_turn_delivered_after_its_job_was_stopped_runs_no_command(
    store: Store, tmp_path: Any
) -> None:
    """The turn's worker leased it and died; the job was cancelled (acknowledged, the turn named
    live); then Temporal delivered the turn again, or a slow worker reached its handler only
    now. The handler read the stopped job and ran the agent's whole command for it anyway, with
    its slot given back (a fourth command of the agent beside three new running jobs): a turn
    started after the cancel was acknowledged. It runs none now, and its end changes nothing."""
    from activities.handlers.agent_turn import run_agent_turn
    from activities.handlers.context import HandlerSettings
    from activities.sandbox import SandboxSettings
    from tests.integration.helpers import started_context

    agent = f"agent-{uuid.uuid4().hex[:6]}"
    marker = tmp_path / "ran"
    command = ["/bin/sh", "-c", f'touch {marker}; echo \'{{"outcome": "done"}}\'']
    registry = tmp_path / "agents.yaml"
    registry.write_text(
        f"agents:\n  - id: {agent}\n    command: {json.dumps(command)}\n", encoding="utf-8"
    )
    job, _ = await lifecycle.create(store, request(agent))
    await dispatcher(store).run_once()
    turn = (await current(store, job.agent_job_id)).queue_job_id
    assert turn is not None
    settings = HandlerSettings(
        agent_jobs=AgentJobSettings(RECEIPT_AGENTS_FILE=str(registry)),
        sandbox=SandboxSettings(
            RECEIPT_CODEX_SANDBOX="none", RECEIPT_WORKSPACE_ROOT=str(tmp_path / "ws")
        ),
    )
    ctx = await started_context(store, turn, settings)  # leased: a live turn
    stopped = await interventions.cancel(store, job.agent_job_id, reason="operator")
    assert stopped.status == "stopped" and stopped.live_turn_job_id == turn
    outcome = await run_agent_turn(ctx)
    assert not marker.exists(), "the agent's command ran for a job stopped before it started"
    assert outcome["outcome"] == "failed" and outcome["retryable"] is False
    assert await lifecycle.settle_turn(store, job.agent_job_id, retry_base_ms=1) is None
    assert (await current(store, job.agent_job_id)).status == "stopped"


async def test_a_stopped_dispatcher_claims_no_more_wakeups_and_cuts_a_post_past_its_grace(
    fresh: tuple[Store, str], caplog: pytest.LogCaptureFixture
) -> None:
    """At the driver's SIGTERM the dispatcher makes no more passes and claims no more wakeup
    posts (another driver takes what comes due) and waits for the posts in flight; one its
    receiver has not answered within the grace is cut (`agent_job.wakeup_drain_cut`): its
    claim lapses and it is posted again."""
    store, url = fresh
    arrived: list[bytes] = []
    answer = asyncio.Event()

    async def hanging(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        arrived.append(await reader.readuntil(b"\r\n\r\n"))
        await answer.wait()
        writer.write(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(hanging, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    first, later = [(await lifecycle.create(store, request(agent)))[0] for _ in range(2)]
    await dispatcher(store).run_once()  # both claimed
    asking = {"outcome": "needs_input", "question": "q", "toolCallId": "c"}
    await play_turn(store, await current(store, first.agent_job_id), asking)
    listener = Listener(url, always=[AGENT_JOBS])
    listening = asyncio.create_task(listener.run())
    await asyncio.wait_for(listener.connected.wait(), 10)
    stop = asyncio.Event()
    async with server, httpx.AsyncClient() as http:
        settings = Settings(RECEIPT_EVENT_CALLBACK_URL=f"http://127.0.0.1:{port}/hook")
        posting = AgentJobDispatcher(
            store, listener, AgentJobSettings(), callbacks=settings, http=http
        )
        running = asyncio.create_task(posting.run(stop, 0.5))
        try:

            async def posts() -> int:
                return len(arrived)

            await eventually(posts, lambda n: n == 1, what="the post in flight")
            stop.set()
            stopped = time.monotonic()
            # The later turn asks after the stop: its wakeup is left to the other drivers.
            await play_turn(store, await current(store, later.agent_job_id), asking)
            await lifecycle.settle_turn(store, later.agent_job_id, retry_base_ms=RETRY_BASE_MS)
            await asyncio.wait_for(running, 5)
            waited_s = time.monotonic() - stopped
            await asyncio.sleep(0.3)  # a post claimed after the stop would have arrived
        finally:
            answer.set()
            running.cancel()
            listening.cancel()
            await asyncio.gather(running, listening, return_exceptions=True)
    assert 0.5 <= waited_s < 2, waited_s
    assert len(arrived) == 1
    async with store.connection() as conn:
        cur = await conn.execute(
            "SELECT job_id, status FROM callback_posts WHERE event = 'session.wakeup'"
        )
        claimed = await cur.fetchall()
    # The cut post's claim stays (it lapses); the later wakeup was never claimed.
    assert [(source.split(":")[0], status) for source, status in claimed] == [
        (first.agent_job_id, "pending")
    ]
    assert len(await session_wakeups(store, later.owner_session_id)) == 1
    assert [r for r in caplog.records if getattr(r, "event", None) == "agent_job.wakeup_drain_cut"]
