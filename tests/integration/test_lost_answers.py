"""A write whose commit's answer was lost (tests/lost_answer.py: the server committed, the
connection dropped before its answer came back): what the storage retry, or the caller, does
next. Nothing is made or settled twice, and what the caller is told is true."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from activities.fence import AttemptFence
from activities.settle import Settlement
from receipts import assembly
from receipts import operations as ops
from receipts.errors import TransientStorageError
from receipts.store import Store
from tests.integration.api_support import AS_A, api_client, enqueue_body, rid
from tests.integration.helpers import create_objective, new_id, put, types
from tests.lost_answer import LostAnswerProxy

LEASE = 60_000
SETTLED = ("completed", "failed", "canceled")


@pytest.fixture
async def proxy(db_url: str) -> AsyncIterator[LostAnswerProxy]:
    proxy = await LostAnswerProxy(db_url).start()
    yield proxy
    await proxy.close()


@pytest.fixture
async def cut_store(proxy: LostAnswerProxy) -> AsyncIterator[Store]:
    """A store whose connections go through `proxy` (the test's `store` reads past it)."""
    store = await assembly.open_store(proxy.url(), min_size=1, max_size=4)
    yield store
    await store.close()


async def running(store: Store, cut_store: Store, worker: str = "w1") -> AttemptFence:
    job = (await put(store, maxAttempts=2)).job
    fence = AttemptFence(cut_store, job.job_id, 1, worker)
    assert (await fence.start(LEASE, {})).ok
    return fence


async def test_a_consume_whose_answer_was_lost_is_the_handlers(
    store: Store, cut_store: Store, proxy: LostAnswerProxy
) -> None:
    """The handler is told it has the steer (its command was marked consumed by its attempt),
    not that it was refused: told False, the SDK's commands() and an agent turn's follow-ups
    dropped it, while the job shows it consumed."""
    fence = await running(store, cut_store)
    sent = await ops.add_command(
        store, fence.job_id, type="steer", payload={"say": "hi"}, organization_id="org-a"
    )
    assert sent.job is not None
    command_id = sent.job.commands[-1].command_id
    proxy.arm("queue.command.consumed")
    taken = await fence.consume(command_id)
    assert proxy.cut.is_set(), proxy.lost
    job = await store.get_job(fence.job_id)
    assert job is not None and job.commands[-1].consumed_attempt == 1
    assert (await types(store, fence.job_id)).count("queue.command.consumed") == 1
    assert taken


async def test_a_start_whose_answer_was_lost_is_its_own_lease(
    store: Store, cut_store: Store, proxy: LostAnswerProxy
) -> None:
    job = (await put(store)).job
    fence = AttemptFence(cut_store, job.job_id, 1, "w1")
    proxy.arm("job.leased")
    out = await fence.start(LEASE, {})
    assert proxy.cut.is_set(), proxy.lost
    assert out.ok and out.already and out.job is not None and out.job.status == "running"
    assert await types(store, job.job_id) == ["job.enqueued", "job.leased", "job.heartbeat"]


async def test_a_takeover_whose_answer_was_lost_is_its_own(
    store: Store, cut_store: Store, proxy: LostAnswerProxy
) -> None:
    first = await running(store, cut_store, worker="j:attempt:1.run/1")
    later = AttemptFence(cut_store, first.job_id, 1, "j:attempt:1.run/2")
    proxy.arm("startFence")
    out = await later.start(LEASE, {})
    assert proxy.cut.is_set(), proxy.lost
    assert out.ok and out.already
    assert (await types(store, first.job_id)).count("job.heartbeat") == 2
    assert not (await first.progress({"p": 1}))  # the earlier delivery is fenced out


@pytest.mark.parametrize("beat", ["heartbeat", "progress"])
async def test_a_heartbeat_or_progress_whose_answer_was_lost(
    store: Store, cut_store: Store, proxy: LostAnswerProxy, beat: str
) -> None:
    fence = await running(store, cut_store)
    before = await types(store, fence.job_id)
    if beat == "heartbeat":
        proxy.arm('"expiresAt"')
        assert (await fence.heartbeat(LEASE)).ok
    else:
        proxy.arm("job.progress")
        assert await fence.progress({"output": "line 1\n"})
    assert proxy.cut.is_set(), proxy.lost
    after = await types(store, fence.job_id)
    job = await store.get_job(fence.job_id)
    assert job is not None and job.status == "running"
    if beat == "progress":
        # A handler's output chunk is one receipt, however its write was retried.
        assert after[len(before) :] == ["job.progress"] and job.progress_count == 1


@pytest.mark.parametrize(
    ("how", "job_status", "status"),
    [
        ("complete", "completed", "completed"),
        ("fail_retryable", "queued", "failed"),
        ("fail_final", "failed", "failed"),
        ("cancel", "canceled", "canceled"),
    ],
)
async def test_a_settle_whose_answer_was_lost_is_reported_as_made(
    store: Store, cut_store: Store, proxy: LostAnswerProxy, how: str, job_status: str, status: str
) -> None:
    fence = await running(store, cut_store)
    settle = Settlement(fence)
    proxy.arm("settlementId")
    if how == "complete":
        task = asyncio.ensure_future(asyncio.sleep(0, {"done": True}))
        await task
        result = await settle.handler_done(task, 0.1)
    elif how == "cancel":
        result = await settle.cancel("asked")
    else:
        retryable = how == "fail_retryable"
        result = await settle.failure("boom", retryable=retryable, status="failed", result=None)
    assert proxy.cut.is_set(), proxy.lost
    assert (result.status, result.job_status) == (status, job_status)
    job = await store.get_job(fence.job_id)
    assert job is not None and (job.status, job.attempt) == (job_status, 1)
    settled = [t for t in await types(store, fence.job_id) if t.split(".")[1] in SETTLED]
    assert len(settled) == 1, settled


async def test_a_release_whose_answer_was_lost_costs_no_attempt(
    store: Store, cut_store: Store, proxy: LostAnswerProxy
) -> None:
    fence = await running(store, cut_store)
    proxy.arm("refundAttempt")
    await Settlement(fence).release()
    assert proxy.cut.is_set(), proxy.lost
    job = await store.get_job(fence.job_id)
    assert job is not None and (job.status, job.attempt) == ("queued", 0)
    assert (await types(store, fence.job_id)).count("job.failed") == 1


@pytest.mark.parametrize("keyed", [False, True])
async def test_an_enqueue_whose_answer_was_lost_says_it_may_have_been_made(
    db_url: str, store: Store, proxy: LostAnswerProxy, keyed: bool
) -> None:
    """The job was made, so '503: the database is unavailable; retry later' was untrue: sent
    again without its Idempotency-Key it is a second job, and the CLI, which shows the key to
    send again only for an answer that may have been applied, hid it. The 503 says the post
    may have been applied, and one sent again with its key finds the job; one that carried no
    key is not told to send it again with 'the same Idempotency-Key' (sent again as it was, with
    none, it is a second job)."""
    key = f"key-{uuid.uuid4().hex}"
    headers = {**AS_A, "Idempotency-Key": key} if keyed else AS_A
    body = enqueue_body(payload_extra={"marker": key})
    async with api_client(proxy.url(db_url)) as client:
        proxy.arm(key)
        answer = await client.post("/agents/codex/jobs", json=body, headers=headers)
        assert proxy.cut.is_set(), proxy.lost
        assert answer.status_code == 503, answer.text
        assert await jobs_holding(store, key) == 1
        message = answer.json()["error"]["message"]
        assert "may have been applied" in message, answer.text
        said = "send it again with the same Idempotency-Key" if keyed else "no Idempotency-Key"
        assert said in message, answer.text
        if keyed:
            again = await client.post("/agents/codex/jobs", json=body, headers=headers)
            assert again.status_code == 202 and again.json()["outcome"] == "existing", again.text
            assert await jobs_holding(store, key) == 1


async def jobs_holding(store: Store, marker: str) -> int:
    """How many jobs were enqueued with `marker` in their payload."""
    async with store.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM receipts WHERE type = 'job.enqueued' AND data::text LIKE %s",
            (f"%{marker}%",),
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_a_batch_of_enqueues_whose_answer_was_lost_says_each_may_have_been_made(
    db_url: str, store: Store, proxy: LostAnswerProxy
) -> None:
    """The group commit's statement (receipts/enqueue_batch.py) committed and its answer was
    lost: every post of the batch is told its job may have been made, as it was."""
    marker = f"batch-{uuid.uuid4().hex}"
    async with api_client(proxy.url(db_url)) as client:
        proxy.arm("WITH batch AS")
        posts = (
            client.post(
                "/agents/codex/jobs",
                json=enqueue_body(payload_extra={"marker": f"{marker}-{i}"}),
                headers=AS_A,
            )
            for i in range(8)
        )
        answers = await asyncio.gather(*posts)
        assert proxy.cut.is_set(), proxy.lost
    unanswered = [a for a in answers if a.status_code == 503]
    assert unanswered and all(a.status_code in (202, 503) for a in answers)
    assert await jobs_holding(store, marker) == len(answers)
    for answer in unanswered:
        assert "may have been applied" in answer.json()["error"]["message"], answer.text


@pytest.mark.parametrize("command", ["steer", "abort"])
async def test_a_command_whose_answer_was_lost_sent_again_with_its_key_is_one(
    db_url: str, store: Store, proxy: LostAnswerProxy, command: str
) -> None:
    key = f"key-{uuid.uuid4().hex}"
    async with api_client(proxy.url(db_url)) as client:
        posted = await client.post("/agents/codex/jobs", json=enqueue_body(), headers=AS_A)
        job_id = posted.json()["job"]["jobId"]
        headers = {**AS_A, "Idempotency-Key": key}
        body = {"type": command, "payload": {"marker": key}, "reason": key}
        proxy.arm(key)
        answer = await client.post(f"/jobs/{job_id}/commands", json=body, headers=headers)
        assert proxy.cut.is_set(), proxy.lost
        assert answer.status_code == 503, answer.text
        assert "may have been applied" in answer.json()["error"]["message"], answer.text
        again = await client.post(f"/jobs/{job_id}/commands", json=body, headers=headers)
        assert again.status_code == 202, again.text
    job = await store.get_job(rid(job_id))
    assert job is not None and [c.type for c in job.commands] == [command]


async def test_a_retry_whose_answer_was_lost_sent_again_is_one(
    db_url: str, store: Store, proxy: LostAnswerProxy
) -> None:
    async with api_client(proxy.url(db_url)) as client:
        posted = await client.post("/agents/codex/jobs", json=enqueue_body(), headers=AS_A)
        job_id = posted.json()["job"]["jobId"]
        abort = {"type": "abort", "reason": "stop"}
        assert (await client.post(f"/jobs/{job_id}/commands", json=abort, headers=AS_A)).is_success
        proxy.arm("job.retried")
        answer = await client.post(f"/jobs/{job_id}/retry", headers=AS_A)
        assert proxy.cut.is_set(), proxy.lost
        assert answer.status_code == 503, answer.text
        assert "may have been applied" in answer.json()["error"]["message"], answer.text
        again = await client.post(f"/jobs/{job_id}/retry", headers=AS_A)
        assert again.is_success and again.json()["outcome"] == "already_retried", again.text
    retried = await store.get_job(rid(job_id))
    assert retried is not None and retried.retried_as is not None
    assert (await types(store, rid(job_id))).count("job.retried") == 1


async def test_a_settle_under_the_row_lock_whose_commit_answer_was_lost_is_made_once(
    store: Store, cut_store: Store, proxy: LostAnswerProxy
) -> None:
    """A task job of an objective settles in a transaction (its objective's control is asked
    for in it): the COMMIT's answer lost, the retry finds its settlement, and control is asked
    for once."""
    objective_id = await create_objective(store, new_id("obj"))
    job = (await put(store, payload_extra={"objectiveId": objective_id})).job
    fence = AttemptFence(cut_store, job.job_id, 1, "w1")
    assert (await fence.start(LEASE, {})).ok
    proxy.arm("settlementId")
    result = await Settlement(fence).failure("boom", retryable=False, status="failed", result=None)
    assert proxy.cut.is_set() and "COMMIT" in proxy.lost, proxy.lost
    assert (result.status, result.job_status) == ("failed", "failed")
    assert (await types(store, job.job_id)).count("job.failed") == 1
    objective = await store.read_stream(f"objectives/{objective_id}")
    assert [r.type for r in objective].count("objective.control_requested") == 1, objective


async def test_a_progress_said_again_after_a_refused_try_is_written(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler saying the same progress twice (`progress("working")` in a loop), the second
    try refused before anything was written (no connection free, a lock not taken): the retry
    writes it. Only a try whose answer was lost may have made it (`again`); taken for one, the
    second receipt was dropped."""
    job = (await put(store, maxAttempts=2)).job
    fence = AttemptFence(store, job.job_id, 1, "w1")
    assert (await fence.start(LEASE, {})).ok
    assert await fence.progress({"status": "working"})
    progress, refused = ops.progress, []

    async def refused_once(*args: Any, **kwargs: Any) -> ops.Outcome:
        if not refused:
            refused.append(1)
            raise TransientStorageError("no database connection available")
        return await progress(*args, **kwargs)

    monkeypatch.setattr(ops, "progress", refused_once)
    assert await fence.progress({"status": "working"})
    after = await store.get_job(job.job_id)
    assert refused and after is not None and after.progress_count == 2, after


async def test_a_write_said_again_still_needs_the_active_lease(store: Store) -> None:
    """The spec: `job.progress` (and a command's consumption) apply the active-lease check. A
    retry that may find its own write (`again`) is checked first like any other: a superseded
    delivery's progress equal to the job's, or its consumption of a command the live attempt
    consumed, is refused, not reported as its own."""
    job = (await put(store, maxAttempts=2)).job
    live = AttemptFence(store, job.job_id, 1, "w1")
    assert (await live.start(LEASE, {})).ok
    assert await live.progress({"status": "working"})
    sent = await ops.add_command(
        store, job.job_id, type="steer", payload={"say": "hi"}, organization_id="org-a"
    )
    assert sent.job is not None
    command_id = sent.job.commands[-1].command_id
    assert await live.consume(command_id)
    before = await types(store, job.job_id)
    stale = {"worker_id": "w0", "attempt": 1}
    progress = await ops.progress(
        store, job.job_id, data={"status": "working"}, again=True, **stale
    )
    consumed = await ops.consume_command(
        store, job.job_id, command_id=command_id, again=True, **stale
    )
    assert not progress.ok and not progress.already, progress.status
    assert not consumed.ok and not consumed.already, consumed.status
    assert await types(store, job.job_id) == before


READ_JOB = "SELECT now(), (SELECT CASE"  # a fenced write's read (job_get_with_now)


@pytest.mark.parametrize("by", ["the same delivery", "the delivery that took over"])
async def test_a_progress_alike_whose_try_was_lost_before_it_wrote_is_written(
    store: Store, cut_store: Store, proxy: LostAnswerProxy, by: str
) -> None:
    """A progress said again alike (the same output chunk twice; the first progress of a
    handler run again by the delivery that took the lease over), its try cut with its read in
    flight (nothing written): the retry, which may be finding its own write, took the job's
    progress alike, written by another write, for it. Told it was written, it never was: one
    chunk fewer in the job's stream. A retry finds only its own write (its `writeId`)."""
    first = await running(store, cut_store, worker="j:attempt:1.run/1")
    assert await first.progress({"output": "waiting\n"})
    fence = first
    if by != "the same delivery":
        fence = AttemptFence(cut_store, first.job_id, 1, "j:attempt:1.run/2")
        assert (await fence.start(LEASE, {})).ok
    proxy.arm(READ_JOB)
    assert await fence.progress({"output": "waiting\n"})
    assert proxy.cut.is_set(), proxy.lost
    job = await store.get_job(fence.job_id)
    assert job is not None and job.progress_count == 2, job
    written = [
        r for r in await store.read_stream(f"jobs/{fence.job_id}") if r.type == "job.progress"
    ]
    assert [r.data["workerId"] for r in written] == ["j:attempt:1.run/1", fence.worker_id]


async def test_a_takeovers_consumption_whose_try_was_lost_is_its_own_not_the_one_before(
    store: Store, cut_store: Store, proxy: LostAnswerProxy
) -> None:
    """The delivery that took the lease over consumes a command the one before it consumed (its
    handler runs from the start: the takeover made the command pending again), its try cut with
    its read in flight (nothing written): its retry must not find the earlier delivery's
    consumption its own (before, it matched the attempt and said so, and no consumption of
    the taker's was written); it finds only its own write (`writeId`), so it writes it."""
    first = await running(store, cut_store, worker="j:attempt:1.run/1")
    sent = await ops.add_command(
        store, first.job_id, type="steer", payload={"say": "hi"}, organization_id="org-a"
    )
    assert sent.job is not None
    command_id = sent.job.commands[-1].command_id
    assert await first.consume(command_id)
    later = AttemptFence(cut_store, first.job_id, 1, "j:attempt:1.run/2")
    assert (await later.start(LEASE, {})).ok
    proxy.arm(READ_JOB)
    assert await later.consume(command_id)
    assert proxy.cut.is_set(), proxy.lost
    consumed = [
        r.data["workerId"]
        for r in await store.read_stream(f"jobs/{first.job_id}")
        if r.type == "queue.command.consumed"
    ]
    assert consumed == ["j:attempt:1.run/1", later.worker_id]
