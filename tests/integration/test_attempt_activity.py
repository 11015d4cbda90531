"""The attempt activity's matrix — lease, settle, failure, execution timeout, abort, takeover by
a redelivery, a settled job — run by Temporal's `ActivityEnvironment` against real PostgreSQL,
with handlers written here: no Temporal server, no worker, no sandbox. The full-stack delivery
tests (tests/integration/delivery/) keep what needs the driver and a worker."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, cast

import pytest
from prometheus_client import REGISTRY
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import ActivityEnvironment

from activities import attempt as attempt_module
from activities.attempt import AttemptActivities, execution_timeout_message
from activities.attempt_reach import CutOff
from activities.fence import AttemptFence
from activities.handlers.context import Handler, HandlerContext, HandlerError
from receipts import delivery_ids, metrics
from receipts import operations as ops
from receipts.errors import StorageError
from receipts.kinds import AGENT_IDS, route
from receipts.listen import Listener
from receipts.messages import AttemptInput, AttemptResult, AttemptStatus
from receipts.notices import COMMANDS
from receipts.store import Store
from tests.eventually import eventually
from tests.integration.helpers import put, types

LEASE_MS = 6_000


def attempt_of(job_id: str, agent: str, attempt: int = 1, **changes: Any) -> AttemptInput:
    """What the driver hands the activity for attempt `attempt` of `job_id`."""
    base = AttemptInput(
        job_id=job_id,
        attempt=attempt,
        agent_id=agent,
        kind="factory.task.run",
        lane="factory",
        lease_ms=LEASE_MS,
        execution_timeout_ms=5_000,
        heartbeat_ms=LEASE_MS // 3,
    )
    return dataclasses.replace(base, **changes)


RUN = "driver-run-1"


async def run(
    store: Store, handlers: Mapping[str, Handler], attempt: AttemptInput, delivery: int = 1
) -> AttemptResult:
    """Delivery `delivery` of `attempt`, as Temporal would run it on a worker (for the driver
    run `RUN`)."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info, attempt=delivery, activity_id=f"attempt:{delivery}", workflow_run_id=RUN
    )
    activities = AttemptActivities(store, handlers, role="test")
    return await env.run(activities.execute_attempt, attempt)


async def job_of(store: Store, agent: str, **payload: Any) -> str:
    return (await put(store, agent=agent, maxAttempts=2, payload_extra=payload)).job.job_id


async def test_a_completed_handler_settles_the_job_with_its_result(store: Store) -> None:
    async def handler(ctx: HandlerContext) -> dict[str, Any]:
        await ctx.progress({"step": 1})
        return {"answer": 42}

    job_id = await job_of(store, "act-ok")
    waits = (
        metrics.ENQUEUE_TO_START._sum.get(),
        sum(b.get() for b in metrics.ENQUEUE_TO_START._buckets),
    )
    result = await run(store, {"act-ok": handler}, attempt_of(job_id, "act-ok"))
    assert (result.status, result.job_status) == (AttemptStatus.COMPLETED, "completed")
    # Its first lease is one sample of the wait for a worker.
    assert sum(b.get() for b in metrics.ENQUEUE_TO_START._buckets) == waits[1] + 1
    job = await store.get_job(job_id)
    assert job is not None and job.result == {"answer": 42}
    assert await types(store, job_id) == [
        "job.enqueued",
        "job.leased",
        "job.heartbeat",
        "job.progress",
        "job.completed",
    ]


@pytest.mark.parametrize(
    ("retryable", "status", "job_status"),
    [(True, AttemptStatus.FAILED, "queued"), (False, AttemptStatus.FAILED, "failed")],
)
async def test_a_failing_handler_requeues_only_when_retryable(
    store: Store, retryable: bool, status: str, job_status: str
) -> None:
    async def handler(ctx: HandlerContext) -> None:
        raise HandlerError("boom", retryable=retryable)

    job_id = await job_of(store, "act-fail")
    result = await run(store, {"act-fail": handler}, attempt_of(job_id, "act-fail"))
    assert (result.status, result.job_status) == (status, job_status)
    job = await store.get_job(job_id)
    assert job is not None and job.error == "boom" and job.status == job_status


async def test_an_agent_without_a_handler_fails_at_once(store: Store) -> None:
    job_id = await job_of(store, "act-nobody")
    result = await run(store, {}, attempt_of(job_id, "act-nobody"))
    assert (result.status, result.job_status) == (AttemptStatus.FAILED, "failed")
    job = await store.get_job(job_id)
    assert job is not None and job.error == "No handler for agent 'act-nobody'"


async def test_a_handler_past_its_execution_timeout_is_cancelled_and_fails_retryably(
    store: Store,
) -> None:
    cancelled = asyncio.Event()

    async def handler(ctx: HandlerContext) -> None:
        try:
            await asyncio.sleep(60)
        finally:
            cancelled.set()

    job_id = await job_of(store, "act-slow")
    attempt = attempt_of(job_id, "act-slow", execution_timeout_ms=300)
    result = await run(store, {"act-slow": handler}, attempt)
    assert result.status == AttemptStatus.EXECUTION_TIMEOUT
    assert cancelled.is_set()
    job = await store.get_job(job_id)
    assert job is not None and job.status == "queued"  # retryable: the next attempt runs
    assert job.error == execution_timeout_message(300)


async def test_a_handler_that_swallows_its_cancellation_is_left_behind_and_the_attempt_settles(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(attempt_module, "HANDLER_CANCEL_S", 0.3)
    release = asyncio.Event()

    async def handler(ctx: HandlerContext) -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):  # a handler's bug
                await asyncio.sleep(60)

    job_id = await job_of(store, "act-stubborn")
    attempt = attempt_of(job_id, "act-stubborn", execution_timeout_ms=300)
    before = metrics.value("receipt_handlers_abandoned_total", agent="other")
    left_before = set(attempt_module._abandoned)
    # Without the bound the attempt waits on the handler for ever (and so would the worker's
    # shutdown): the test hangs.
    result = await run(store, {"act-stubborn": handler}, attempt)
    assert result.status == AttemptStatus.EXECUTION_TIMEOUT
    assert metrics.value("receipt_handlers_abandoned_total", agent="other") == before + 1
    job = await store.get_job(job_id)
    assert job is not None and job.status == "queued"
    (task,) = set(attempt_module._abandoned) - left_before
    release.set()
    task.cancel()

    async def left() -> bool:
        return task in attempt_module._abandoned

    await eventually(left, lambda held: not held, timeout=5, what="the abandoned handler's end")


def test_each_agent_s_abandoned_series_exists_from_the_start(store: Store) -> None:
    # An alert on the counter's increase sees the first abandonment only if the series was
    # there before it, at 0.
    agent = AGENT_IDS[0]
    AttemptActivities(store, {agent: _never_called}, role="test")
    for label in (agent, "other"):
        assert (
            REGISTRY.get_sample_value("receipt_handlers_abandoned_total", {"agent": label})
            is not None
        )


async def _never_called(ctx: HandlerContext) -> None:
    raise AssertionError("not run")


async def test_an_abort_while_running_stops_the_handler_and_cancels_the_job(
    store: Store,
) -> None:
    running, stopped = asyncio.Event(), asyncio.Event()

    async def handler(ctx: HandlerContext) -> None:
        running.set()
        await ctx.aborted.wait()
        stopped.set()

    job_id = await job_of(store, "act-abort")
    delivery = asyncio.create_task(
        run(store, {"act-abort": handler}, attempt_of(job_id, "act-abort"))
    )
    await asyncio.wait_for(running.wait(), 10)
    sent = await ops.add_command(
        store, job_id, type="abort", reason="enough", organization_id="org-a"
    )
    assert sent.ok
    result = await asyncio.wait_for(delivery, 30)
    assert stopped.is_set()
    assert (result.status, result.job_status) == (AttemptStatus.CANCELED, "canceled")


async def test_a_redelivery_takes_the_lease_over_and_the_first_delivery_cannot_settle(
    store: Store,
) -> None:
    release = asyncio.Event()
    deliveries: list[str] = []

    async def handler(ctx: HandlerContext) -> dict[str, str]:
        deliveries.append(ctx.worker_id)
        if len(deliveries) == 1:  # the first delivery: frozen until the second has settled
            await release.wait()
        return {"by": ctx.worker_id}

    job_id = await job_of(store, "act-twice")
    handlers = {"act-twice": handler}
    first = asyncio.create_task(run(store, handlers, attempt_of(job_id, "act-twice"), 1))

    async def started() -> list[str]:
        return deliveries

    await eventually(started, what="the first delivery running")
    second = await run(store, handlers, attempt_of(job_id, "act-twice"), 2)
    release.set()
    stale = await asyncio.wait_for(first, 30)
    assert second.status == AttemptStatus.COMPLETED
    assert stale.status in (AttemptStatus.LEASE_LOST, AttemptStatus.TERMINAL_STATE)
    job = await store.get_job(job_id)
    assert job is not None and job.result == {"by": delivery_ids.delivery_id(job_id, 1, RUN, 2)}
    written = await types(store, job_id)
    assert written.count("job.completed") == 1


async def test_a_delivery_of_a_settled_job_runs_nothing(store: Store) -> None:
    ran: list[str] = []

    async def handler(ctx: HandlerContext) -> None:
        ran.append(ctx.worker_id)

    job_id = await job_of(store, "act-late")
    handlers = {"act-late": handler}
    assert (await run(store, handlers, attempt_of(job_id, "act-late"), 1)).status == "completed"
    late = await run(store, handlers, attempt_of(job_id, "act-late"), 2)
    assert late.status in (AttemptStatus.STALE_ATTEMPT, AttemptStatus.TERMINAL_STATE)
    assert ran == [delivery_ids.delivery_id(job_id, 1, RUN, 1)]


async def test_a_delivery_taken_over_holds_no_fence_of_a_refunded_attempts_next_run(
    store: Store,
) -> None:
    """Delivery 1 of attempt 1 froze, delivery 2 took the lease over, then released it at its
    worker's shutdown (attempt refunded); the driver's next run scheduled attempt 1 again, its
    first delivery numbered 1 again. With the same worker id as the frozen one, every write of
    the frozen delivery was accepted as the new one's and it settled the job. The run is in the
    id: the frozen delivery is refused."""
    job_id = await job_of(store, "act-refunded")
    frozen = delivery_ids.delivery_id(job_id, 1, "run-a", 1)
    taker = delivery_ids.delivery_id(job_id, 1, "run-a", 2)
    fresh = delivery_ids.delivery_id(job_id, 1, "run-b", 1)
    assert len({frozen, taker, fresh}) == 3
    assert (
        await ops.start_attempt(store, job_id, attempt=1, worker_id=frozen, lease_ms=LEASE_MS)
    ).ok
    assert (
        await ops.start_attempt(store, job_id, attempt=1, worker_id=taker, lease_ms=LEASE_MS)
    ).ok
    released = await ops.fail(
        store,
        job_id,
        worker_id=taker,
        attempt=1,
        error="worker shutdown",
        retryable=True,
        refund_attempt=True,
    )
    assert released.ok and released.job is not None
    assert (released.job.status, released.job.attempt) == ("queued", 0)
    assert (
        await ops.start_attempt(store, job_id, attempt=1, worker_id=fresh, lease_ms=LEASE_MS)
    ).ok
    beat = await ops.heartbeat(store, job_id, worker_id=frozen, attempt=1, lease_ms=LEASE_MS)
    assert beat.status == "lease_lost"
    late = await ops.complete(store, job_id, worker_id=frozen, attempt=1, result={"by": "a"})
    assert late.status == "lease_lost"
    done = await ops.complete(store, job_id, worker_id=fresh, attempt=1, result={"by": "b"})
    assert done.ok and done.job is not None and done.job.result == {"by": "b"}


async def test_a_job_released_at_shutdown_and_delivered_again_is_no_lost_worker(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """A rolling restart: the old worker's SIGTERM released the job (attempt refunded) and
    Temporal delivered the attempt again to the new worker, which leased the queued job. That
    delivery was logged `attempt.redelivered` (WARNING, "lease taken over"), counted in
    `receipt_attempt_redeliveries_total` (a worker lost, a start-fence takeover) and its lease
    observed in `receipt_enqueue_to_start_seconds` as a wait of the whole first run: every
    rollout looked like lost workers and slow starts. Neither is: only a takeover is counted
    and logged, and only the job's first lease is a start."""
    job_id = await job_of(store, "act-released")
    first = delivery_ids.delivery_id(job_id, 1, RUN, 1)
    assert (
        await ops.start_attempt(store, job_id, attempt=1, worker_id=first, lease_ms=LEASE_MS)
    ).ok
    await asyncio.sleep(1.5)  # the first run, cut by the worker's shutdown
    released = await ops.fail(
        store,
        job_id,
        worker_id=first,
        attempt=1,
        error="worker shutdown",
        retryable=True,
        refund_attempt=True,
    )
    assert released.ok and released.job is not None and released.job.status == "queued"
    labels = {"queue": route("act-released", "factory.task.run"), "agent": "other"}
    redelivered = metrics.value("receipt_attempt_redeliveries_total", **labels)
    starts = metrics.value("receipt_enqueue_to_start_seconds_count")
    started_s = metrics.value("receipt_enqueue_to_start_seconds_sum")

    async def handler(ctx: HandlerContext) -> str:
        return "done"

    caplog.set_level("DEBUG", logger="activities.attempt")
    result = await run(store, {"act-released": handler}, attempt_of(job_id, "act-released"), 2)
    assert result.status == AttemptStatus.COMPLETED
    assert metrics.value("receipt_attempt_redeliveries_total", **labels) == redelivered
    assert [r for r in caplog.records if getattr(r, "event", "") == "attempt.redelivered"] == []
    # Observed once, at the first lease (the job's wait for a worker), never again.
    assert metrics.value("receipt_enqueue_to_start_seconds_count") == starts
    assert metrics.value("receipt_enqueue_to_start_seconds_sum") == started_s


async def test_a_stalled_delivery_of_an_older_run_cannot_take_a_newer_runs_lease(
    store: Store,
) -> None:
    """Delivery 1 of attempt 1 (driver run a) was released at its worker's shutdown (attempt
    refunded) and Temporal started delivery 2 of run a, whose worker stalled before its start;
    run a's window closed, and the driver's next run b scheduled attempt 1 again: its delivery 1
    leased and runs. Run a's delivery 2 then wakes. Only the delivery number was compared
    (2 > 1), so the stalled delivery of the ended run took the lease over and the live one's
    handler was stopped at its next heartbeat. Deliveries of different runs are not ordered by
    their numbers: the stalled one is refused."""
    job_id = await job_of(store, "act-other-run")
    first = delivery_ids.delivery_id(job_id, 1, "run-a", 1)
    stalled = delivery_ids.delivery_id(job_id, 1, "run-a", 2)
    fresh = delivery_ids.delivery_id(job_id, 1, "run-b", 1)
    assert (
        await ops.start_attempt(store, job_id, attempt=1, worker_id=first, lease_ms=LEASE_MS)
    ).ok
    released = await ops.fail(
        store,
        job_id,
        worker_id=first,
        attempt=1,
        error="worker shutdown",
        retryable=True,
        refund_attempt=True,
    )
    assert released.ok and released.job is not None and released.job.status == "queued"
    assert (
        await ops.start_attempt(store, job_id, attempt=1, worker_id=fresh, lease_ms=LEASE_MS)
    ).ok
    late = await ops.start_attempt(store, job_id, attempt=1, worker_id=stalled, lease_ms=LEASE_MS)
    assert late.status == "lease_lost", late.status
    beat = await ops.heartbeat(store, job_id, worker_id=fresh, attempt=1, lease_ms=LEASE_MS)
    assert beat.ok, beat.status
    done = await ops.complete(store, job_id, worker_id=fresh, attempt=1, result={"by": "b"})
    assert done.ok and done.job is not None and done.job.result == {"by": "b"}


async def test_a_heartbeat_that_cannot_be_written_stops_the_handler_before_the_attempt_raises(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The heartbeats' task raised (the database away past its retries): the attempt raised
    and Temporal would deliver it again, but the handler was left running beside that next
    delivery — nobody cancelled it."""
    running, cancelled = asyncio.Event(), asyncio.Event()

    async def handler(ctx: HandlerContext) -> None:
        running.set()
        try:
            await asyncio.sleep(60)  # ignores `aborted`: only a cancellation stops it
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def refused(self: object, lease_ms: int) -> None:
        raise StorageError("the database is away")

    monkeypatch.setattr(AttemptFence, "heartbeat", refused)
    job_id = await job_of(store, "act-beat")
    attempt = attempt_of(job_id, "act-beat", heartbeat_ms=200)
    with pytest.raises(StorageError, match="the database is away"):
        await asyncio.wait_for(run(store, {"act-beat": handler}, attempt), 30)
    assert running.is_set() and cancelled.is_set()


async def test_a_delivery_taken_over_stops_its_handler_before_the_next_one_starts(
    store: Store, db_url: str
) -> None:
    """Temporal had not heard from delivery 1 for its heartbeat timeout (its worker cut off from
    Temporal, not from PostgreSQL) and delivered the attempt again. Delivery 1 heard of the
    takeover only at its next `job.heartbeat`, a lease cadence away (here 20 s), or every 2 s
    once Temporal's cancellation reached it: both handlers ran at once (1-2.2 s measured after a
    Temporal outage). Its watcher hears the takeover's notice and stops the handler, and
    delivery 2 starts its own only `TAKEOVER_GRACE_S` after its takeover."""
    listener = Listener(db_url, always=[COMMANDS])
    listening = asyncio.create_task(listener.run())
    await asyncio.wait_for(listener.connected.wait(), 10)
    spans: dict[str, list[float]] = {}

    async def handler(ctx: HandlerContext) -> dict[str, str]:
        span = spans.setdefault(ctx.worker_id, [time.monotonic()])
        try:
            if len(spans) == 1:
                await asyncio.sleep(60)  # the first delivery: until stopped
            return {"by": ctx.worker_id}
        finally:
            span.append(time.monotonic())

    job_id = await job_of(store, "act-taken")
    slow = attempt_of(job_id, "act-taken", lease_ms=60_000, heartbeat_ms=20_000)
    slow = dataclasses.replace(slow, execution_timeout_ms=50_000)

    async def deliver(delivery: int) -> AttemptResult:
        env = ActivityEnvironment()
        env.info = dataclasses.replace(
            env.info, attempt=delivery, activity_id=f"attempt:{delivery}", workflow_run_id=RUN
        )
        activities = AttemptActivities(store, {"act-taken": handler}, listener=listener)
        return await env.run(activities.execute_attempt, slow)

    try:
        first = asyncio.create_task(deliver(1))
        await eventually(lambda: _value(len(spans)), what="the first handler running")
        second = await asyncio.wait_for(deliver(2), 20)
        stopped = await asyncio.wait_for(first, 10)
    finally:
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)
    assert second.status == AttemptStatus.COMPLETED
    assert stopped.status == AttemptStatus.LEASE_LOST, stopped
    (one, two) = sorted(spans.values())
    assert one[1] < two[0], spans  # the first handler ended before the second began
    job = await store.get_job(job_id)
    assert job is not None and job.result == {"by": delivery_ids.delivery_id(job_id, 1, RUN, 2)}


async def _value(value: int) -> int:
    return value


class Temporal:
    """A client's `workflow_service.get_system_info`: answers, or is unreachable."""

    def __init__(self, answers: bool) -> None:
        self.answers = answers
        self.probes = 0
        self.workflow_service = self

    async def get_system_info(self, request: Any, **_: Any) -> None:
        self.probes += 1
        if not self.answers:
            raise RPCError("unreachable", RPCStatusCode.UNAVAILABLE, b"")


async def run_heard(
    store: Store,
    handlers: Mapping[str, Handler],
    attempt: AttemptInput,
    temporal: Temporal,
    delivery: int = 1,
) -> AttemptResult:
    """`run` on a worker whose Temporal client is `temporal`, Temporal's heartbeat timeout 4 s
    (a beat a second: the reach watch reads the job at its first look, `quiet_s(4)` is 0)."""
    env = ActivityEnvironment(client=cast(Client, temporal))
    env.info = dataclasses.replace(
        env.info,
        attempt=delivery,
        activity_id=f"attempt:{delivery}",
        workflow_run_id=RUN,
        heartbeat_timeout=timedelta(seconds=4),
    )
    activities = AttemptActivities(store, handlers, role="test")
    return await env.run(activities.execute_attempt, attempt)


def cut_offs(outcome: str) -> float:
    return REGISTRY.get_sample_value("receipt_attempts_cut_off_total", {"outcome": outcome}) or 0


async def test_a_worker_temporal_and_postgres_stopped_answering_stops_its_handler(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Temporal and the job's read both unanswered: the handler is stopped (~2-3 s in: the
    watch's look past `quiet_s(4)`, 2 s; not at its end 30 s in) and the attempt raises, for
    Temporal to deliver it again."""
    running, stopped = asyncio.Event(), asyncio.Event()

    async def handler(ctx: HandlerContext) -> None:
        running.set()
        try:
            await asyncio.sleep(30)
        finally:
            stopped.set()

    async def unreachable(job_id: str) -> None:
        raise StorageError("connection refused")

    job_id = await job_of(store, "act-cut")
    attempt = attempt_of(job_id, "act-cut", execution_timeout_ms=40_000)
    before = cut_offs("unreadable")
    temporal = Temporal(answers=False)
    began = time.monotonic()
    first = asyncio.create_task(run_heard(store, {"act-cut": handler}, attempt, temporal))
    await asyncio.wait_for(running.wait(), 10)
    monkeypatch.setattr(store, "get_job", unreachable)
    with pytest.raises(CutOff, match="the job unreadable"):
        await asyncio.wait_for(first, 20)
    took = time.monotonic() - began
    assert stopped.is_set() and took < 5, took
    assert cut_offs("unreadable") == before + 1
    assert temporal.probes >= 1


async def test_a_worker_temporal_stopped_answering_stops_its_handler_once_taken_over(
    store: Store,
) -> None:
    """Temporal unanswered, the job's lease taken over by a later delivery (its notice unheard:
    no listener; its next job.heartbeat 20 s away): the handler stops at the watch's next look
    (`quiet_s(4)`, 2 s), not at that heartbeat, and the attempt reports `lease_lost`."""
    ended: dict[int, float] = {}

    async def handler(ctx: HandlerContext) -> str:
        delivery = delivery_ids.delivery_number(ctx.worker_id) or 1
        try:
            await asyncio.sleep(30 if delivery == 1 else 1)
        finally:
            ended[delivery] = time.monotonic()
        return "done"

    job_id = await job_of(store, "act-taken")
    attempt = attempt_of(
        job_id, "act-taken", lease_ms=60_000, heartbeat_ms=20_000, execution_timeout_ms=40_000
    )
    before = cut_offs("taken_over")
    began = time.monotonic()
    first = asyncio.create_task(
        run_heard(store, {"act-taken": handler}, attempt, Temporal(answers=False))
    )
    await asyncio.sleep(0.5)
    second = await run(store, {"act-taken": handler}, attempt, 2)
    stale = await asyncio.wait_for(first, 20)
    assert second.status == AttemptStatus.COMPLETED
    assert stale.status == AttemptStatus.LEASE_LOST and "taken over" in str(stale.error), stale
    assert cut_offs("taken_over") == before + 1
    assert ended[1] - began < 5, ended[1] - began


@pytest.mark.parametrize("temporal_answers", [True, False])
async def test_a_worker_cut_from_one_of_temporal_and_postgres_runs_its_handler_on(
    store: Store, monkeypatch: pytest.MonkeyPatch, temporal_answers: bool
) -> None:
    """Temporal answering (the job unreadable: PostgreSQL away), or the job readable and still
    this delivery's (Temporal away, hearing nobody else): the handler runs to its end."""

    async def handler(ctx: HandlerContext) -> str:
        await asyncio.sleep(3.5)
        return "done"

    async def unreachable(job_id: str) -> None:
        raise StorageError("connection refused")

    job_id = await job_of(store, "act-half")
    attempt = attempt_of(job_id, "act-half", execution_timeout_ms=40_000)
    if temporal_answers:
        monkeypatch.setattr(store, "get_job", unreachable)
    temporal = Temporal(answers=temporal_answers)
    result = await run_heard(store, {"act-half": handler}, attempt, temporal)
    assert (result.status, result.job_status) == (AttemptStatus.COMPLETED, "completed")
    assert temporal.probes >= 1


async def test_an_attempt_shorter_than_one_temporal_beat_probes_nothing(store: Store) -> None:
    async def handler(ctx: HandlerContext) -> str:
        return "done"

    job_id = await job_of(store, "act-short")
    temporal = Temporal(answers=True)
    result = await run_heard(
        store, {"act-short": handler}, attempt_of(job_id, "act-short"), temporal
    )
    assert result.status == AttemptStatus.COMPLETED
    assert temporal.probes == 0
