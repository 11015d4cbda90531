"""What a handler may write, against real PostgreSQL: its own job, and objectives, only while its
delivery holds its attempt's fence."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
import pytest

from activities.fence import AttemptFence
from activities.handlers.context import HandlerContext
from activities.handlers.fenced import FencedReceipts, FenceLost
from activities.settle import Settlement
from receipts import metrics
from receipts import operations as ops
from receipts.objectives import store as objectives
from receipts.objectives.model import monitor_job_id, objective_stream, session_key, task_job_id
from receipts.store import Draft, Store
from tests.integration.helpers import create_objective, new_id, put, types

LEASE = 60_000


async def started(store: Store, worker: str) -> HandlerContext:
    """A handler's context for delivery `worker` of attempt 1 of a new, started job."""
    job = (await put(store)).job
    fence = AttemptFence(store, job.job_id, attempt=1, worker_id=worker)
    out = await fence.start(LEASE, {"role": "test"})
    assert out.ok and out.job is not None
    return HandlerContext(job=out.job, attempt=1, worker_id=worker, receipts=FencedReceipts(fence))


async def test_a_handler_writes_progress_and_consumes_commands_while_it_holds_the_lease(
    store: Store,
) -> None:
    ctx = await started(store, "j:attempt:1/1")
    job_id = ctx.job.job_id
    steer = await ops.add_command(
        store, job_id, type="steer", payload={"say": "hi"}, organization_id=ctx.job.organization_id
    )
    assert steer.ok
    assert await ctx.progress({"output": "working"})
    (pending,) = await ctx.pending_commands()
    assert await ctx.consume(pending.command_id)
    assert await ctx.pending_commands() == ()
    assert (await types(store, job_id))[-3:] == [
        "queue.command",
        "job.progress",
        "queue.command.consumed",
    ]


async def test_a_handler_whose_delivery_was_superseded_writes_nothing_to_its_job(
    store: Store,
) -> None:
    ctx = await started(store, "j:attempt:1/1")
    job_id = ctx.job.job_id
    # Temporal redelivered the attempt: the new delivery takes the lease over (start fence).
    newer = AttemptFence(store, job_id, attempt=1, worker_id="j:attempt:1/2")
    assert (await newer.start(LEASE, {"role": "test"})).ok
    org = ctx.job.organization_id
    assert (await ops.add_command(store, job_id, type="steer", organization_id=org)).ok
    written = await types(store, job_id)
    (pending,) = await ctx.pending_commands()  # reads still work
    assert not await ctx.progress({"output": "late"})
    assert not await ctx.consume(pending.command_id)
    assert await types(store, job_id) == written


async def objective(store: Store) -> str:
    """A live objective with one pending task, written straight to its stream."""
    return await create_objective(store, new_id("obj"))


def progress_line(objective_id: str) -> Any:
    def decide(state: Any) -> list[Draft]:
        line = {"taskId": "t", "try": 1, "jobId": "x", "lastLine": "late", "lines": 1}
        return [Draft("objective.task.progress", line)] if state is not None else []

    return decide


async def test_a_superseded_delivery_writes_nothing_to_an_objective(
    store: Store, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    objective_id = await objective(store)
    stale = await started(store, "j:attempt:1/1")
    newer = AttemptFence(store, stale.job.job_id, attempt=1, worker_id="j:attempt:1/2")
    assert (await newer.start(LEASE, {"role": "test"})).ok  # Temporal redelivered the attempt
    refused = "receipt_objective_writes_refused_total"
    before = metrics.value(refused, reason="lease_lost")
    written = [r.type for r in await store.read_stream(objective_stream(objective_id))]
    with caplog.at_level(logging.WARNING, "activities.handlers.fenced"):
        with pytest.raises(FenceLost, match="lease_lost"):
            await stale.receipts.update_objective(objective_id, progress_line(objective_id))
        with pytest.raises(FenceLost, match="lease_lost"):
            await stale.receipts.request_control(objective_id, "reconcile")
        # Control passes: the pass would dispatch the pending task (two jobs and a receipt).
        with pytest.raises(FenceLost, match="lease_lost"):
            await stale.receipts.reconcile(objective_id, "factory.objective.control")
    assert [r.type for r in await store.read_stream(objective_stream(objective_id))] == written
    state = await objectives.get(store, objective_id)
    assert state is not None and state.task("t") is not None
    assert state.task("t").status == "pending"  # type: ignore[union-attr]
    # The pass's task and monitor jobs were enqueued in the refused transaction: rolled back.
    tries = [task_job_id(objective_id, "t", 1), monitor_job_id(objective_id, "t", 1)]
    assert await objectives.jobs_by_ids(store, tries) == {}
    assert state.control_job_id is None  # the refused request delivered no control job
    assert metrics.value(refused, reason="lease_lost") - before == 3
    events = [getattr(r, "event", None) for r in caplog.records]
    assert events.count("attempt.objective_write_refused") == 3


async def test_the_delivery_that_holds_the_fence_writes_to_the_objective(store: Store) -> None:
    objective_id = await objective(store)
    stale = await started(store, "j:attempt:1/1")
    newer = AttemptFence(store, stale.job.job_id, attempt=1, worker_id="j:attempt:1/2")
    assert (await newer.start(LEASE, {"role": "test"})).ok
    current = FencedReceipts(newer)
    await current.update_objective(objective_id, progress_line(objective_id))
    await current.request_control(objective_id, "reconcile")
    result = await current.reconcile(objective_id, "factory.objective.control")
    assert result.dispatched == ["t"]
    tries = [task_job_id(objective_id, "t", 1), monitor_job_id(objective_id, "t", 1)]
    assert sorted(await objectives.jobs_by_ids(store, tries)) == sorted(tries)
    kinds = [r.type for r in await store.read_stream(objective_stream(objective_id))]
    assert kinds[1:] == [
        "objective.task.progress",
        "objective.control_requested",
        "objective.control_delivered",
        "objective.task.dispatched",
        "objective.reconciled",
    ]


async def test_a_settled_job_s_handler_writes_nothing_to_an_objective(store: Store) -> None:
    objective_id = await objective(store)
    ctx = await started(store, "j:attempt:1/1")
    fence = AttemptFence(store, ctx.job.job_id, attempt=1, worker_id="j:attempt:1/1")
    assert (await fence.complete({"done": True})).ok
    with pytest.raises(FenceLost, match="terminal_state"):
        await ctx.receipts.update_objective(objective_id, progress_line(objective_id))


async def test_a_handler_s_write_waits_for_its_job_row_before_the_objective_stream(
    store: Store, db_url: str
) -> None:
    """A task job's settle or lease expiry locks its row, then the objective's stream (it asks
    for control). The handler's write takes them in the same order, so the two wait on each
    other in turn; the other order is a deadlock PostgreSQL breaks by aborting one of them."""
    objective_id = await objective(store)
    job = (await put(store, payload_extra={"objectiveId": objective_id})).job
    worker = f"{job.job_id}:attempt:1/1"
    fence = AttemptFence(store, job.job_id, attempt=1, worker_id=worker)
    assert (await fence.start(LEASE, {"role": "test"})).ok
    handler = FencedReceipts(fence, job.session_key)
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM jobs WHERE job_id = %s FOR UPDATE", (job.job_id,))
            writing = asyncio.create_task(
                handler.update_objective(objective_id, progress_line(objective_id))
            )
            await asyncio.sleep(0.5)
            assert not writing.done()  # waiting on the row, holding nothing of the objective
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                ("stream:" + objective_stream(objective_id),),
            )
        await asyncio.wait_for(writing, 10)
    kinds = [r.type for r in await store.read_stream(objective_stream(objective_id))]
    assert kinds[-1] == "objective.task.progress"


async def test_a_control_job_checks_its_fence_after_the_objective_stream(store: Store) -> None:
    """A control job's row is locked after the stream by `deliver`; its own guard keeps that
    order, and a control request it delivers steers itself in the same transaction."""
    objective_id = await objective(store)
    async with store.transaction() as tx:
        await objectives.request_control(tx, objective_id, "created")
    state = await objectives.get(store, objective_id)
    assert state is not None and state.control_job_id is not None
    control = await store.get_job(state.control_job_id)
    assert control is not None and control.session_key == session_key(objective_id)
    worker = f"{control.job_id}:attempt:1/1"
    fence = AttemptFence(store, control.job_id, attempt=1, worker_id=worker)
    assert (await fence.start(LEASE, {"role": "test"})).ok
    handler = FencedReceipts(fence, control.session_key)
    await handler.request_control(objective_id, "reconcile")
    steered = await store.get_job(control.job_id)
    assert steered is not None and len(steered.pending_commands) == 1
    newer = AttemptFence(
        store, control.job_id, attempt=1, worker_id=f"{control.job_id}:attempt:1/2"
    )
    assert (await newer.start(LEASE, {"role": "test"})).ok
    written = [r.type for r in await store.read_stream(objective_stream(objective_id))]
    with pytest.raises(FenceLost, match="lease_lost"):
        await handler.request_control(objective_id, "reconcile")
    assert [r.type for r in await store.read_stream(objective_stream(objective_id))] == written


async def test_a_handler_ended_by_a_refused_objective_write_settles_nothing_and_is_no_bug(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    objective_id = await objective(store)
    stale = await started(store, "j:attempt:1/1")
    newer = AttemptFence(store, stale.job.job_id, attempt=1, worker_id="j:attempt:1/2")
    assert (await newer.start(LEASE, {"role": "test"})).ok
    handler = asyncio.create_task(
        stale.receipts.update_objective(objective_id, progress_line(objective_id))
    )
    await asyncio.wait({handler})
    assert isinstance(handler.exception(), FenceLost)
    before = await types(store, stale.job.job_id)
    fence = AttemptFence(store, stale.job.job_id, attempt=1, worker_id="j:attempt:1/1")
    with caplog.at_level(logging.INFO):
        result = await Settlement(fence).handler_done(handler, 0.1)
    assert result.status == "lease_lost"
    assert await types(store, stale.job.job_id) == before
    events = [getattr(r, "event", None) for r in caplog.records]
    assert "attempt.handler_error" not in events


async def test_another_organizations_objective_and_jobs_look_absent_to_a_handler(
    store: Store,
) -> None:
    """A job of org-b naming org-a's objective (and org-a's jobs) reads none of them and writes
    nothing to them, whatever ids its payload names (docs/design.md §9)."""
    objective_id = await objective(store)  # org-a's
    theirs = (await put(store)).job  # org-a's job
    job = (await put(store, org="org-b", payload_extra={"objectiveId": objective_id})).job
    worker = f"{job.job_id}:attempt:1/1"
    fence = AttemptFence(store, job.job_id, attempt=1, worker_id=worker)
    assert (await fence.start(LEASE, {"role": "test"})).ok
    handler = FencedReceipts(fence, job.session_key, job.organization_id)
    before = await store.read_stream(objective_stream(objective_id))
    assert await handler.objective(objective_id) is None
    assert await handler.job(theirs.job_id) is None
    assert await handler.jobs([theirs.job_id]) == {}
    assert await handler.job_receipts(theirs.job_id, 0) == []
    asked: list[Any] = []

    def create_when_absent(state: Any) -> list[Draft]:  # as factory.run's decide does
        asked.append(state)
        return [Draft("objective.created", {"objectiveId": objective_id})] if state is None else []

    assert not await handler.update_objective(objective_id, progress_line(objective_id))
    assert not await handler.update_objective(objective_id, create_when_absent)
    assert asked == []  # never asked: another organization's objective is left alone
    assert not await handler.request_control(objective_id, "reconcile")
    assert (await handler.reconcile(objective_id, "factory.objective.control")).passes == 0
    scanned, _ = await handler.active_objectives(2000)  # what a watchdog of org-b would see
    assert objective_id not in {s.objective_id for s in scanned}
    assert all(s.organization_id == "org-b" for s in scanned)
    assert await store.read_stream(objective_stream(objective_id)) == before
    # The runtime's own work (no organization: the watchdog) reads every organization's.
    system = FencedReceipts(fence, None, None)
    assert await system.objective(objective_id) is not None


async def test_a_settled_job_of_another_organization_requests_no_control(store: Store) -> None:
    """The outbox hook of a reconciling kind asks for control on the objective its payload
    names only when that objective is the job's organization's."""
    objective_id = await objective(store)  # org-a's
    job = (await put(store, org="org-b", payload_extra={"objectiveId": objective_id})).job
    before = await store.read_stream(objective_stream(objective_id))
    fence = AttemptFence(store, job.job_id, attempt=1, worker_id=f"{job.job_id}:attempt:1/1")
    assert (await fence.start(LEASE, {"role": "test"})).ok
    assert (await fence.complete({"done": True})).ok
    assert await store.read_stream(objective_stream(objective_id)) == before
    own = (await put(store, payload_extra={"objectiveId": objective_id})).job  # org-a's
    fence = AttemptFence(store, own.job_id, attempt=1, worker_id=f"{own.job_id}:attempt:1/1")
    assert (await fence.start(LEASE, {"role": "test"})).ok
    assert (await fence.complete({"done": True})).ok
    after = await store.read_stream(objective_stream(objective_id))
    assert [r.type for r in after[len(before) :]] == ["objective.control_requested"]
