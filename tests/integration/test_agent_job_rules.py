"""Agent-job rules on real PostgreSQL that no other test failed for when broken: the claim's
lock order (B11), the input timeout's re-checks under the row lock against an answer (B8),
an answer naming another tool call (B8), the failed wakeup's error (B6, B7) and the fence of
a settlement against a turn that still runs (B12). Each was shown to fail with its code broken.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import httpx

from receipts import operations as ops
from receipts.agent_jobs import claims, interventions, lifecycle, model
from receipts.agent_jobs import reads as agent_reads
from receipts.agent_jobs.model import AgentJob
from receipts.agent_jobs.registry import AgentJobSettings
from receipts.settings import Settings
from receipts.store import Store
from roles.delivery.agent_jobs import AgentJobDispatcher
from tests.integration.test_agent_jobs import (
    current,
    dispatcher,
    play_turn,
    request,
    session_wakeups,
)


async def _blocked_on_a_lock(store: Store, timeout_s: float = 5.0) -> None:
    """Wait until some backend of this database waits for a lock (the claimer, on the row)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        async with store.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            row = await cur.fetchone()
        if row is not None and row[0] > 0:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the claim never waited for the job row")


async def _claim_waits_for_the_row_holding_the_slot_lock(
    store: Store, job: AgentJob, expect: str
) -> AgentJob:
    """Hold the job row; a claim must take its agent's slot lock first and wait for the row
    while holding it: another transaction then cannot take that slot lock."""
    claim = claims.claim_attempt if expect == "queued" else claims.claim_continuation
    async with store.transaction() as holder:
        assert await lifecycle.job_for_update(holder, job.agent_job_id) is not None
        claiming = asyncio.create_task(claim(store, job.agent_job_id, job.agent_id))
        await _blocked_on_a_lock(store)
        async with store.transaction() as probe:
            key = claims.slot_lock_key(job.agent_id, job.organization_id)
            taken = await probe.try_lock_key(key)
        assert not taken, "the claim waits for the job row without its agent's slot lock"
    claimed = await claiming
    assert isinstance(claimed, AgentJob) and claimed.status == "running"
    return claimed


async def test_both_claim_paths_take_the_slot_lock_then_the_job_row(
    fresh: tuple[Store, str],
) -> None:
    """The spec: both claim paths take the agent's slot lock and then the job row FOR UPDATE,
    in that fixed order (B11). The claim racing tests pass whichever order is taken."""
    store, _ = fresh
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    job, _ = await lifecycle.create(store, request(agent))
    running = await _claim_waits_for_the_row_holding_the_slot_lock(store, job, "queued")
    await play_turn(store, running, {"outcome": "needs_input", "question": "q", "toolCallId": "c"})
    assert (await dispatcher(store).run_once()).settled == 1
    await interventions.answer(store, job.agent_job_id, answer="yes", tool_call_id="c")
    waiting = await current(store, job.agent_job_id)
    assert waiting.answer_pending
    continued = await _claim_waits_for_the_row_holding_the_slot_lock(
        store, waiting, "waiting_on_user"
    )
    assert (continued.attempt, continued.turn) == (1, 2)


async def _waiting(store: Store, agent: str) -> AgentJob:
    job, _ = await lifecycle.create(store, request(agent))
    claimed = await claims.claim_attempt(store, job.agent_job_id, agent)
    assert isinstance(claimed, AgentJob)
    await play_turn(store, claimed, {"outcome": "needs_input", "question": "q", "toolCallId": "c"})
    settled = await lifecycle.settle_turn(store, job.agent_job_id, retry_base_ms=10)
    assert settled is not None and settled.status == "waiting_on_user"
    return settled


async def test_an_input_timeout_rechecks_the_answer_and_the_wait_under_the_row_lock(
    fresh: tuple[Store, str],
) -> None:
    """The dispatcher reads the overdue jobs, then fails each in its own transaction: an
    answer (or an answer, a continuation and a new question) committed in between must win.
    The race test (test_an_answer_racing_the_input_timeout) rarely lands in that gap and
    passed with either re-check removed."""
    store, _ = fresh
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    job = await _waiting(store, agent)
    await asyncio.sleep(0.1)
    assert job.agent_job_id in await agent_reads.input_overdue(store, 50)  # the pass's read
    # The owner answers before the timeout's transaction, which comes later than the timeout
    # again (a slow pass, one job after another): the answer stands.
    await interventions.answer(store, job.agent_job_id, answer="B", tool_call_id="c")
    await asyncio.sleep(0.1)
    assert await interventions.fail_overdue_input(store, job.agent_job_id, timeout_ms=50) is None
    answered = await current(store, job.agent_job_id)
    assert answered.status == "waiting_on_user" and answered.answer_pending
    # The continuation runs and asks again: a fresh wait, not overdue, is not failed either.
    continued = await claims.claim_continuation(store, job.agent_job_id, agent)
    assert isinstance(continued, AgentJob)
    await play_turn(
        store, continued, {"outcome": "needs_input", "question": "q2", "toolCallId": "c2"}
    )
    again = await lifecycle.settle_turn(store, job.agent_job_id, retry_base_ms=10)
    assert again is not None and again.status == "waiting_on_user"
    assert (
        await interventions.fail_overdue_input(store, job.agent_job_id, timeout_ms=60_000) is None
    )
    final = await current(store, job.agent_job_id)
    assert final.status == "waiting_on_user" and final.pending_tool_call is not None
    assert [w["status"] for w in await session_wakeups(store, job.owner_session_id)] == [
        "waiting_on_user",
        "waiting_on_user",
    ]


async def test_an_answer_naming_another_tool_call_is_refused_and_writes_nothing(
    fresh: tuple[Store, str],
) -> None:
    """The answer resumes the pending tool call: one naming another is refused (409
    not_waiting through the API), nothing written; none named answers the pending one."""
    store, _ = fresh
    job = await _waiting(store, f"agent-{uuid.uuid4().hex[:6]}")
    chain = await store.read_stream(model.stream_of(job.agent_job_id))
    try:
        await interventions.answer(store, job.agent_job_id, answer="B", tool_call_id="other")
    except interventions.NotWaiting as exc:
        assert str(exc) == f"agent job {job.agent_job_id!r} waits for tool call 'c'"
    else:
        raise AssertionError("an answer to another tool call was taken")
    assert await store.read_stream(model.stream_of(job.agent_job_id)) == chain
    answered = await interventions.answer(store, job.agent_job_id, answer="B", tool_call_id=None)
    assert answered.answer == {"toolCallId": "c", "answer": "B"}


async def test_a_failed_wakeup_carries_the_error_and_a_succeeded_one_the_result(
    fresh: tuple[Store, str],
) -> None:
    """The owner hears why its job failed: the `failed` wakeup carries the job's error (the
    `succeeded` one its result), with the job's reply route."""
    store, _ = fresh
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    failing, _ = await lifecycle.create(store, request(agent))
    winning, _ = await lifecycle.create(store, request(agent))
    assert (await dispatcher(store).run_once()).claimed == 2
    await play_turn(
        store,
        await current(store, failing.agent_job_id),
        {"outcome": "failed", "error": "the repository is gone", "retryable": False},
    )
    await play_turn(
        store, await current(store, winning.agent_job_id), {"outcome": "done", "result": {"pr": 7}}
    )
    assert (await dispatcher(store).run_once()).settled == 2
    [failed] = await session_wakeups(store, failing.owner_session_id)
    assert (failed["status"], failed["error"]) == ("failed", "the repository is gone")
    assert failed["replyRoute"] == {"binding": "slack", "channel": "C1", "thread": "T1"}
    assert failed["latestStatus"] == {"state": "failed", "errorCode": None, "pendingToolCall": None}
    [succeeded] = await session_wakeups(store, winning.owner_session_id)
    assert (succeeded["status"], succeeded["result"]) == ("succeeded", {"pr": 7})
    assert "error" not in succeeded and "result" not in failed


async def test_a_settlement_leaves_a_job_whose_turn_still_runs_alone(
    fresh: tuple[Store, str],
) -> None:
    """Only a terminal turn settles its job: a settlement asked while the turn runs (a stale
    read, a racing dispatcher) writes nothing, and the job keeps its slot and its turn."""
    store, _ = fresh
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    job, _ = await lifecycle.create(store, request(agent))
    running = await claims.claim_attempt(store, job.agent_job_id, agent)
    assert isinstance(running, AgentJob) and running.queue_job_id is not None
    worker = f"{running.queue_job_id}:attempt:1/1"
    started = await ops.start_attempt(
        store, running.queue_job_id, attempt=1, worker_id=worker, lease_ms=60_000
    )
    assert started.ok
    chain = await store.read_stream(model.stream_of(job.agent_job_id))
    assert await lifecycle.settle_turn(store, job.agent_job_id, retry_base_ms=10) is None
    assert await store.read_stream(model.stream_of(job.agent_job_id)) == chain
    still = await current(store, job.agent_job_id)
    assert (still.status, still.queue_job_id, still.attempt) == ("running", running.queue_job_id, 1)


async def test_a_receiver_back_from_an_outage_hears_a_sessions_wakeups_in_order(
    fresh: tuple[Store, str],
) -> None:
    """The wakeup is the session's event, in the session's order. A receiver that answered
    503 to `waiting_on_user` (down) and was back when the job `succeeded` heard `succeeded`
    first and then, on the retry 30 s later, `waiting_on_user`: the owner was woken to answer
    a question of a job that had finished. A session's later wakeup is posted to a URL only
    once its earlier ones to that URL are posted (or given up)."""
    store, _ = fresh
    heard: list[str] = []
    down = True

    async def receiver(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        body = json.loads(await reader.readexactly(length))
        if down:
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
        else:
            heard.append(body["wakeup"]["data"]["status"])
            writer.write(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(receiver, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    job, _ = await lifecycle.create(store, request(agent))
    async with server, httpx.AsyncClient() as http:
        settings = Settings(RECEIPT_EVENT_CALLBACK_URL=f"http://127.0.0.1:{port}/hook")
        posting = AgentJobDispatcher(
            store, None, AgentJobSettings(retry_base_ms=10), callbacks=settings, http=http
        )
        await posting.run_once()
        await play_turn(
            store,
            await current(store, job.agent_job_id),
            {"outcome": "needs_input", "question": "q", "toolCallId": "c"},
        )
        assert (await posting.run_once()).callbacks == 0  # 503: the receiver is down
        down = False
        await interventions.answer(store, job.agent_job_id, answer="B", tool_call_id="c")
        await posting.run_once()  # the continuation
        await play_turn(
            store, await current(store, job.agent_job_id), {"outcome": "done", "result": 1}
        )
        await posting.run_once()  # succeeded
        async with store.connection() as conn:  # 30 s pass: the failed post is due again
            await conn.execute(
                "UPDATE callback_posts SET posted_at = now() - interval '31 seconds' "
                "WHERE job_id = %(s)s",
                {"s": f"{job.agent_job_id}:waiting_on_user:1:1"},
            )
        for _ in range(3):
            await posting.run_once()
        await posting.close()
    assert heard == ["waiting_on_user", "succeeded"]
