"""Agent jobs under real concurrency (two stores: two driver processes), each race repeated.
Each test states its invariant and checks it from the receipt chains (not the projection).
The racers are closures over the round's ids, awaited within the round (B023 does not apply)."""
# ruff: noqa: B023

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from typing import Any

import pytest

from receipts import assembly
from receipts import operations as ops
from receipts.agent_jobs import claims, interventions, lifecycle, model
from receipts.agent_jobs.model import AgentJob
from receipts.agent_jobs.registry import AgentJobSettings
from receipts.errors import ConflictError
from receipts.store import Store
from roles.delivery.agent_jobs import AgentJobDispatcher
from tests.integration.test_agent_jobs import request

ROUNDS = 25


async def claimed_turn(store: Store) -> tuple[AgentJob, str]:
    """A new agent job of a new agent, its first turn claimed: the job and the turn's job id."""
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    job, _ = await lifecycle.create(store, request(agent))
    claimed = await claims.claim_attempt(store, job.agent_job_id, agent)
    assert isinstance(claimed, AgentJob) and claimed.queue_job_id
    return job, claimed.queue_job_id


def dispatcher(store: Store, **settings: Any) -> AgentJobDispatcher:
    return AgentJobDispatcher(store, None, AgentJobSettings(retry_base_ms=20, **settings))


FAILED_STEPS: list[Any] = []


async def passing(store: Store, **settings: Any) -> Any:
    """A dispatcher pass; a step that raised (swallowed and logged by the pass) fails the test."""
    result = await dispatcher(store, **settings).run_once()
    assert result.failed == 0, result
    return result


async def jitter() -> None:
    await asyncio.sleep(random.random() * 0.004)


async def chain(store: Store, agent_job_id: str) -> AgentJob:
    folded = model.fold(await store.read_stream(model.stream_of(agent_job_id)))
    assert folded is not None
    return folded


async def transitions(store: Store, agent_job_id: str) -> list[dict[str, Any]]:
    return [
        dict(r.data)
        for r in await store.read_stream(model.stream_of(agent_job_id))
        if r.type == model.TRANSITIONED
    ]


async def check_chain_matches_projection(store: Store, agent_job_id: str) -> AgentJob:
    folded = await chain(store, agent_job_id)
    row = await lifecycle.get(store, agent_job_id)
    assert row is not None
    assert row.model_dump() == folded.model_dump(), agent_job_id
    return folded


async def lease_turn(store: Store, queue_id: str) -> str:
    worker = f"{queue_id}:attempt:1/1"
    started = await ops.start_attempt(store, queue_id, attempt=1, worker_id=worker, lease_ms=60_000)
    assert started.ok, started.status
    return worker


async def end_turn(store: Store, queue_id: str, worker: str, outcome: dict[str, Any] | None) -> Any:
    """As the turn's handler ends: consume the pending follow-ups, then complete (or fail)."""
    if outcome is None:
        return await ops.fail(
            store, queue_id, worker_id=worker, attempt=1, error="died", retryable=True
        )
    job = await store.get_job(queue_id)
    assert job is not None
    from receipts.commands import with_payloads

    taken = []
    for command in await with_payloads(store, queue_id, job.pending_commands):
        if command.type == "follow_up":
            got = await ops.consume_command(
                store, queue_id, worker_id=worker, attempt=1, command_id=command.command_id
            )
            if got.ok:
                taken.append(command.payload)
    result = dict(outcome)
    if taken:
        result["followUps"] = taken
    return await ops.complete(store, queue_id, worker_id=worker, attempt=1, result=result)


async def wakeups(store: Store, session_id: str) -> list[dict[str, Any]]:
    return [dict(r.data) for r in await store.read_stream(model.session_stream(session_id))]


@pytest.fixture
async def two(fresh: tuple[Store, str]) -> Any:
    """Two stores on one database: two driver processes' pools."""
    store, url = fresh
    other = await assembly.open_store(url, min_size=2, max_size=10)
    yield store, other
    await other.close()


# --- 1. slots: two dispatchers, more queued jobs than slots -----------------------------------


async def test_two_dispatchers_never_run_more_than_three(two: Any) -> None:
    """Invariant: at every commit, at most 3 of the agent's jobs are `running` (folded from
    their chains); every turn queue job is enqueued once."""
    a, b = two
    for _ in range(max(ROUNDS // 5, 3)):
        agent = f"agent-{uuid.uuid4().hex[:6]}"
        ids = [(await lifecycle.create(a, request(agent)))[0].agent_job_id for _ in range(7)]
        for _ in range(12):
            live = [await chain(a, i) for i in ids]
            running = [j for j in live if j.status == "running"]
            assert len(running) <= 3, [j.status for j in live]
            # End one running turn while two dispatchers (two pools) pass at once.
            enders = []
            for j in running[:2]:
                assert j.queue_job_id is not None
                turn = await a.get_job(j.queue_job_id)
                if turn is not None and turn.status == "queued":
                    w = await lease_turn(a, j.queue_job_id)
                    kind = random.choice(["done", "needs_input", "failed"])
                    outcome = (
                        {"outcome": "done", "result": 1}
                        if kind == "done"
                        else {"outcome": "needs_input", "question": "q", "toolCallId": "c"}
                        if kind == "needs_input"
                        else {"outcome": "failed", "error": "x", "retryDelayMs": 0}
                    )
                    enders.append(end_turn(a, j.queue_job_id, w, outcome))
            answers = [
                interventions.answer(a, j.agent_job_id, answer="y", tool_call_id="c")
                for j in live
                if j.status == "waiting_on_user" and j.answer is None
            ]
            await asyncio.gather(
                passing(a),
                passing(b),
                passing(b),
                *enders,
                *answers,
                return_exceptions=False,
            )
            folded = [await check_chain_matches_projection(a, i) for i in ids]
            assert sum(j.status == "running" for j in folded) <= 3
        for i in ids:
            ids_seen = (await chain(a, i)).queue_job_ids
            assert len(ids_seen) == len(set(ids_seen))


# --- 2. an answer racing the input timeout ----------------------------------------------------


async def waiting_job(store: Store) -> AgentJob:
    job, qid = await claimed_turn(store)
    w = await lease_turn(store, qid)
    await end_turn(
        store,
        qid,
        w,
        {"outcome": "needs_input", "question": "q", "toolCallId": "call-1"},
    )
    settled = await lifecycle.settle_turn(store, job.agent_job_id, retry_base_ms=20)
    assert settled is not None and settled.status == "waiting_on_user"
    return settled


async def test_an_answer_racing_the_input_timeout(two: Any) -> None:
    """Invariant: an answer the API accepted is never followed by an input-timeout failure;
    exactly one of the two wins."""
    a, b = two
    timeout_ms = 30
    for _ in range(ROUNDS):
        job = await waiting_job(a)
        await asyncio.sleep(timeout_ms / 1000 + 0.005)

        async def answering() -> Any:
            await jitter()
            try:
                return await interventions.answer(
                    a, job.agent_job_id, answer="B", tool_call_id="call-1"
                )
            except interventions.NotWaiting as exc:
                return exc

        async def timing_out() -> Any:
            await jitter()
            return await passing(b, input_timeout_ms=timeout_ms)

        answered, _ = await asyncio.gather(answering(), timing_out())
        folded = await check_chain_matches_projection(a, job.agent_job_id)
        if isinstance(answered, AgentJob):
            assert folded.status in ("waiting_on_user", "running"), folded.status
            assert folded.answer is not None or folded.status == "running"
        else:
            assert folded.status == "failed" and "no answer" in (folded.error or "")
        wk = await wakeups(a, job.owner_session_id)
        assert len({w["sourceId"] for w in wk}) == len(wk)


# --- 3. two answers to one waiting job --------------------------------------------------------


async def test_two_different_answers_one_accepted(two: Any) -> None:
    """Invariant: of two different answers at once, exactly one is recorded; the other is
    refused 409 (NotWaiting). The same answer twice: both answered, one receipt."""
    a, b = two
    for n in range(ROUNDS):
        job = await waiting_job(a)
        same = n % 2 == 0

        async def answering(store: Store, text: str) -> Any:
            await jitter()
            try:
                return await interventions.answer(
                    store, job.agent_job_id, answer=text, tool_call_id="call-1"
                )
            except interventions.NotWaiting as exc:
                return exc

        results = await asyncio.gather(
            answering(a, "A"),
            answering(b, "A" if same else "B"),
            passing(b),
        )
        receipts = await a.read_stream(model.stream_of(job.agent_job_id))
        answered = [r for r in receipts if r.type == model.ANSWERED]
        assert len(answered) == 1
        oks = [r for r in results[:2] if isinstance(r, AgentJob)]
        if same:
            # a retry of the same answer: both accepted — unless the claim moved it on first
            assert len(oks) >= 1
        else:
            assert len(oks) == 1
            assert answered[0].data["answer"] == oks[0].answer["answer"]  # type: ignore[index]


# --- 4. cancel racing the end of a turn -------------------------------------------------------

OUTCOMES = [
    {"outcome": "done", "result": "r"},
    {"outcome": "needs_input", "question": "q", "toolCallId": "c"},
    {"outcome": "failed", "error": "e", "retryDelayMs": 0},
    {"outcome": "failed", "error": "e", "retryable": False},
    None,
]


async def test_cancel_racing_a_turns_end(two: Any) -> None:
    """Invariant: a cancel that answered 200 leaves the job `stopped`, nothing after it on the
    chain; no wakeup is written for the turn that a cancel beat; no turn queue job of a
    stopped job is left queued (a live one is named liveTurnJobId); a cancel refused finds a
    terminal job."""
    a, b = two
    for n in range(ROUNDS * 2):
        job, qid = await claimed_turn(a)
        outcome = OUTCOMES[n % len(OUTCOMES)]
        leased = n % 3 != 0
        w = await lease_turn(a, qid) if leased else None

        async def cancelling() -> Any:
            await jitter()
            try:
                return await interventions.cancel(b, job.agent_job_id, reason="stop")
            except interventions.AlreadyTerminal as exc:
                return exc

        async def ending() -> Any:
            await jitter()
            if w is None:
                return await ops.cancel_queued(a, qid, reason="x")
            return await end_turn(a, qid, w, outcome)

        canceled, _, _ = await asyncio.gather(cancelling(), ending(), passing(a))
        await passing(b)
        await passing(a)
        folded = await check_chain_matches_projection(a, job.agent_job_id)
        moves = await transitions(a, job.agent_job_id)
        if isinstance(canceled, AgentJob):
            # the cancel's transition is the last one
            stop = [i for i, m in enumerate(moves) if m["to"] == "stopped"]
            assert stop and stop[-1] == len(moves) - 1, moves
            assert folded.status == "stopped"
        else:
            assert folded.terminal
        if folded.status == "stopped":
            stopped_from = moves[-1]["from"]
            wk = await wakeups(a, job.owner_session_id)
            if stopped_from == "running":
                # the turn's outcome was fenced out: no wakeup at all for this turn
                assert not [x for x in wk if x["turn"] == moves[-1]["turn"]], wk
        for qj in folded.queue_job_ids:
            turn = await a.get_job(qj)
            assert turn is not None
            if not turn.terminal:
                assert folded.live_turn_job_id == qj, (folded, turn.status)


# --- 5. a follow-up racing the end of a turn --------------------------------------------------


async def test_follow_up_racing_a_turns_end_is_never_lost(two: Any) -> None:
    """Invariant: a follow-up the queue accepted reaches the next turn (TURN_STARTED's or the
    transition's followUps) exactly once; a refused one is refused as terminal_state."""
    a, b = two
    for n in range(ROUNDS * 2):
        job, qid = await claimed_turn(a)
        w = await lease_turn(a, qid)
        outcome = OUTCOMES[n % len(OUTCOMES)]
        marker = f"fu-{n}"

        async def following() -> Any:
            await jitter()
            return await interventions.add_command(
                b, qid, type="follow_up", payload=marker, check_organization=False
            )

        async def ending() -> Any:
            await jitter()
            return await end_turn(a, qid, w, outcome)

        sent, _, _ = await asyncio.gather(following(), ending(), passing(b))
        await passing(a)
        folded = await check_chain_matches_projection(a, job.agent_job_id)
        receipts = await a.read_stream(model.stream_of(job.agent_job_id))
        carried = []
        for r in receipts:
            if r.type in (model.TURN_STARTED, model.TRANSITIONED) and r.data.get("followUps"):
                carried.append(list(r.data["followUps"]))
        if sent.ok:
            assert carried, (outcome, folded.status, receipts[-1].data)
            # handed to the next turn (the first receipt after the turn that carries it)
            assert carried[0].count(marker) == 1, carried
            if folded.status == "running" and folded.queue_job_id != qid:
                nxt = await a.get_job(folded.queue_job_id or "")
                assert nxt is not None
                assert folded.follow_up == [marker] or marker in (folded.follow_up or [])
        else:
            assert sent.status == "terminal_state", sent.status


# --- 6. retry with delay racing a cancel; wakeups exactly once ---------------------------------


async def test_retry_with_delay_racing_cancel_and_claims(two: Any) -> None:
    """Invariant: once stopped, nothing moves the job (no claim of a retry after the cancel);
    no turn queue job is left queued."""
    a, b = two
    for _ in range(ROUNDS):
        job, qid = await claimed_turn(a)
        w = await lease_turn(a, qid)
        await end_turn(a, qid, w, {"outcome": "failed", "error": "e", "retryDelayMs": 3})

        async def cancelling() -> Any:
            await asyncio.sleep(random.random() * 0.01)
            try:
                return await interventions.cancel(b, job.agent_job_id, reason="stop")
            except interventions.AlreadyTerminal as exc:
                return exc

        async def passes(store: Store) -> None:
            for _ in range(3):
                await passing(store)
                await asyncio.sleep(0.003)

        canceled, _, _ = await asyncio.gather(cancelling(), passes(a), passes(b))
        await passing(a)
        folded = await check_chain_matches_projection(a, job.agent_job_id)
        assert isinstance(canceled, AgentJob)
        assert folded.status == "stopped"
        for qj in folded.queue_job_ids:
            turn = await a.get_job(qj)
            assert turn is not None and (turn.terminal or folded.live_turn_job_id == qj)


async def test_wakeups_exactly_once_under_racing_settlements(two: Any) -> None:
    """Invariant: one wakeup per (job, status, attempt, turn): racing settle_turn calls (two
    pools, several each) write one transition and one wakeup."""
    a, b = two
    for n in range(ROUNDS):
        agent = f"agent-{uuid.uuid4().hex[:6]}"
        session = f"shared-{uuid.uuid4().hex[:6]}"
        jobs = [
            (await lifecycle.create(a, request(agent, owner_session_id=session)))[0]
            for _ in range(3)
        ]
        for job in jobs:
            claimed = await claims.claim_attempt(a, job.agent_job_id, agent)
            assert isinstance(claimed, AgentJob) and claimed.queue_job_id
            w = await lease_turn(a, claimed.queue_job_id)
            outcome = OUTCOMES[(n + len(job.agent_job_id)) % 4]
            await end_turn(a, claimed.queue_job_id, w, outcome)
        await asyncio.gather(
            *(
                lifecycle.settle_turn(s, j.agent_job_id, retry_base_ms=20)
                for j in jobs
                for s in (a, b, a, b)
            ),
            passing(a),
            passing(b),
            return_exceptions=False,
        )
        wk = await wakeups(a, session)
        ids = Counter(w["sourceId"] for w in wk)
        assert all(c == 1 for c in ids.values()), ids
        async with a.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM agent_job_wakeups WHERE session_id = %(s)s", {"s": session}
            )
            row = await cur.fetchone()
        assert row is not None and row[0] == len(wk)
        for job in jobs:
            moves = await transitions(a, job.agent_job_id)
            entered = [m for m in moves if m["to"] in model.WAKEUP_STATUSES]
            assert len([w for w in wk if w["agentJobId"] == job.agent_job_id]) == len(entered)


async def test_cancel_racing_a_claim(two: Any) -> None:
    """Invariant: a cancel racing the dispatcher's claim leaves no turn queue job queued for a
    stopped job (and no dispatch slot held by one)."""
    a, b = two
    for _ in range(ROUNDS):
        agent = f"agent-{uuid.uuid4().hex[:6]}"
        ids = [(await lifecycle.create(a, request(agent)))[0].agent_job_id for _ in range(4)]

        async def cancelling(i: str) -> Any:
            await jitter()
            try:
                return await interventions.cancel(b, i, reason="stop")
            except (interventions.AlreadyTerminal, ConflictError) as exc:
                return exc

        await asyncio.gather(passing(a), passing(b), *(cancelling(i) for i in ids))
        for i in ids:
            folded = await check_chain_matches_projection(a, i)
            assert folded.status == "stopped"
            for qj in folded.queue_job_ids:
                turn = await a.get_job(qj)
                assert turn is not None and turn.terminal, (qj, turn and turn.status)


async def test_a_follow_up_to_a_stopped_jobs_live_turn_is_refused(two: Any) -> None:
    """A cancel stops the job while its turn runs on; a follow-up posted to that turn after the
    cancel is accepted (the queue job still runs) and consumed by the turn's end, but the fence
    refuses everything that turn's end would write: no next turn ever gets it, and nothing
    says so. Invariant: accepted => handed on; otherwise refused."""
    a, _ = two
    job, qid = await claimed_turn(a)
    w = await lease_turn(a, qid)
    stopped = await interventions.cancel(a, job.agent_job_id, reason="stop")
    assert stopped.status == "stopped" and stopped.live_turn_job_id == qid
    sent = await interventions.add_command(
        a, qid, type="follow_up", payload="late", check_organization=False
    )
    await end_turn(a, qid, w, {"outcome": "done", "result": "r"})
    await passing(a)
    turn = await a.get_job(qid)
    assert turn is not None
    consumed = [c for c in turn.commands if c.type == "follow_up"]
    print("accepted:", sent.ok, sent.status, "consumed:", [c.consumed_attempt for c in consumed])
    assert not sent.ok and sent.status == "agent_job_not_running", sent.status
