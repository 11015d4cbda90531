"""Recovery loops: run_once called directly, concurrently, against real PostgreSQL and Temporal."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Coroutine
from typing import Any

import pytest
from temporalio.client import Client

from receipts import deliveries, metrics
from receipts import operations as ops
from receipts.store import Store
from roles.delivery.loops import (
    ObjectiveControlOutboxRedrive,
    QueuedRedrive,
)
from roles.infra.settings import LoopSettings
from tests.integration.delivery.conftest import (
    running_stack,
    wait_for_scheduled_attempt,
    wait_for_status,
)
from tests.integration.helpers import callbacks_owed, put, types

NOW = LoopSettings(redrive_min_age_ms=0, redrive_cooldown_ms=0)


def task(*argv: str) -> dict[str, Any]:
    return {"task": {"command": list(argv)}}


async def test_two_concurrent_passes_expire_a_dead_lease_once(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    async with running_stack(client, fresh_store, fresh_db, queues=(), dispatcher=False) as s:
        job = (await put(fresh_store, maxAttempts=2)).job
        assert (
            await ops.lease(fresh_store, job.job_id, attempt=1, worker_id="dead", lease_ms=1)
        ).ok
        await asyncio.sleep(0.05)
        passes = [QueuedRedrive(fresh_store, None, s.settings, NOW) for _ in range(2)]
        results = await asyncio.gather(*(p.run_once() for p in passes))
    assert sum(r.expired for r in results) == 1
    assert (await types(fresh_store, job.job_id)).count("job.lease_expired") == 1
    requeued = await fresh_store.get_job(job.job_id)
    assert requeued is not None and requeued.status == "queued"


async def test_two_concurrent_passes_dispatch_one_observed_queue_state_once(
    client: Client, fresh_store: Store, fresh_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="roles.delivery.loops")  # as roles log in production
    async with running_stack(client, fresh_store, fresh_db, dispatcher=False) as s:
        job = (await put(fresh_store, payload_extra=task("true"))).job
        passes = [QueuedRedrive(fresh_store, s.starter, s.settings, NOW) for _ in range(3)]
        results = await asyncio.gather(*(p.run_once() for p in passes))
        assert sum(r.redriven for r in results) == 1
        assert sum(r.skipped for r in results) == 2
        (logged,) = [r for r in caplog.records if getattr(r, "event", "") == "redrive.dispatched"]
        assert logged.jobId == job.job_id and logged.driverCreated is True  # type: ignore[attr-defined]
        done = await wait_for_status(fresh_store, job.job_id)
    assert done.status == "completed"
    latest = (await deliveries.job_and_latest(fresh_store, job.job_id))[1]
    assert latest is not None and latest.generation == 0


async def test_redrive_respects_the_minimum_age_and_cooldown(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    async with running_stack(client, fresh_store, fresh_db, queues=(), dispatcher=False) as s:
        job = (await put(fresh_store, payload_extra=task("true"))).job
        young = QueuedRedrive(
            fresh_store,
            s.starter,
            s.settings,
            LoopSettings(redrive_min_age_ms=60_000, redrive_cooldown_ms=0),
        )
        assert (await young.run_once()).redriven == 0
        first = QueuedRedrive(fresh_store, s.starter, s.settings, NOW)
        assert (await first.run_once()).redriven == 1
        # Its delivery went quiet for good: an open driver would make any pass start nothing
        # (active_delivery), whatever its cooldown, so the driver is ended first.
        await client.get_workflow_handle(job.job_id).terminate("a delivery that went quiet")
        cooling = QueuedRedrive(
            fresh_store,
            s.starter,
            s.settings,
            LoopSettings(redrive_min_age_ms=0, redrive_cooldown_ms=60_000),
        )
        assert (await cooling.run_once()).redriven == 0  # within the cooldown
        assert (
            await QueuedRedrive(fresh_store, s.starter, s.settings, NOW).run_once()
        ).redriven == 1
        assert (await deliveries.job_and_latest(fresh_store, job.job_id))[1] is not None


async def test_a_dead_workers_job_is_recovered_by_the_scan_with_a_higher_attempt(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    async with running_stack(client, fresh_store, fresh_db, dispatcher=False) as s:
        job = (await put(fresh_store, payload_extra=task("true"))).job
        # A worker leased attempt 1 and died before Temporal ever heard of the job.
        assert (
            await ops.lease(fresh_store, job.job_id, attempt=1, worker_id="gone", lease_ms=1)
        ).ok
        await asyncio.sleep(0.05)
        redrive = QueuedRedrive(fresh_store, s.starter, s.settings, NOW)
        result = await redrive.run_once()
        assert (result.expired, result.redriven) == (1, 1)  # expired, then redriven, one pass
        assert (await redrive.run_once()).redriven == 0  # same observed state: not again
        done = await wait_for_status(fresh_store, job.job_id)
    assert (done.status, done.attempt) == ("completed", 2)
    written = await types(fresh_store, job.job_id)
    assert written[:3] == ["job.enqueued", "job.leased", "job.lease_expired"]


def test_the_outbox_redrive_a_role_builds_observes_at_15_s_every_5_s() -> None:
    """J48/J49: the outbox redrive every role that runs it builds (`serve`:
    `ObjectiveControlOutboxRedrive.of(..., LoopSettings)`) ticks every 5 000 ms and calls a pass
    slow past its spec default of 15 000 ms; both variables are read into it."""

    async def source() -> int:
        return 0

    loop = ObjectiveControlOutboxRedrive.of(source, LoopSettings.load({}))
    assert (loop.interval_ms, loop.timeout_ms) == (5_000, 15_000)
    configured = ObjectiveControlOutboxRedrive.of(
        source,
        LoopSettings.load(
            {
                "RECEIPT_OBJECTIVE_CONTROL_OUTBOX_REDRIVE_INTERVAL_MS": "700",
                "RECEIPT_OBJECTIVE_CONTROL_OUTBOX_REDRIVE_TIMEOUT_MS": "900",
            }
        ),
    )
    assert (configured.interval_ms, configured.timeout_ms) == (700, 900)


async def test_outbox_redrive_is_single_flight_and_reports_a_slow_pass(caplog: Any) -> None:
    gate = asyncio.Event()
    calls = 0

    async def slow_source() -> int:
        nonlocal calls
        calls += 1
        await gate.wait()
        return 3

    slow = ("receipt_loop_slow_passes_total", {"loop": "objective_control_outbox_redrive"})
    slow_before = metrics.value(slow[0], **slow[1])
    loop = ObjectiveControlOutboxRedrive(slow_source, interval_ms=10, timeout_ms=50)
    first: asyncio.Task[int | None] = asyncio.create_task(_run(loop.run_once()))
    await asyncio.sleep(0.1)
    assert await loop.run_once() is None  # a tick during the pass coalesces
    gate.set()
    assert await first == 3
    assert calls == 1 and loop.coalesced == 1
    assert metrics.value(slow[0], **slow[1]) - slow_before == 1
    assert any(
        r.__dict__.get("event") == "factory.control_outbox_redrive_slow" for r in caplog.records
    )


async def _run(coro: Coroutine[Any, Any, int | None]) -> int | None:
    return await coro


def test_the_redrive_key_is_the_specs() -> None:
    """The spec's queued-redrive dispatch key: `<jobId>:redrive:<observedSeq>:<attempt>`."""
    assert deliveries.redrive_key("job-1", 3, 1) == "job-1:redrive:3:1"


def test_loop_settings_use_the_spec_names_and_defaults() -> None:
    from receipts.settings import SettingsError

    defaults = LoopSettings.load({})
    assert (
        defaults.redrive_interval_ms,
        defaults.outbox_interval_ms,
        defaults.redrive_min_age_ms,
        defaults.redrive_cooldown_ms,
    ) == (15_000, 5_000, 30_000, 15_000)
    config = LoopSettings.load(
        {
            "RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS": "1000",
            "RECEIPT_RESONATE_QUEUED_REDRIVE_MIN_AGE_MS": " 2000 ",
            "RECEIPT_RESONATE_QUEUED_REDRIVE_COOLDOWN_MS": "3000",
        }
    )
    assert (config.redrive_interval_ms, config.redrive_min_age_ms) == (1000, 2000)
    assert config.redrive_cooldown_ms == 3000
    with pytest.raises(
        SettingsError,
        match="RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS must be a whole number of milliseconds",
    ):
        LoopSettings.load({"RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS": "soon"})


async def test_a_redrive_that_finds_an_open_delivery_does_not_spend_its_key(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    async with running_stack(client, fresh_store, fresh_db, queues=(), dispatcher=False) as s:
        job = (await put(fresh_store, payload_extra=task("true"))).job
        first = await s.starter.start(job.job_id)
        assert first.created
        redrive = QueuedRedrive(fresh_store, s.starter, s.settings, NOW)
        result = await redrive.run_once()
        assert (result.redriven, result.skipped) == (0, 1)  # active_delivery: key given back
        await wait_for_scheduled_attempt(client, job.job_id, "attempt:1")
        await client.get_workflow_handle(job.job_id).terminate("test: the delivery is lost")
        again = await redrive.run_once()
        assert again.redriven == 1  # the same observed queue state is redriven now
        latest = (await deliveries.job_and_latest(fresh_store, job.job_id))[1]
        assert latest is not None and latest.generation == 1
        await s.start_worker("receipt-codex")
        done = await wait_for_status(fresh_store, job.job_id)
    assert done.status == "completed"


async def test_a_state_whose_redriven_delivery_is_lost_again_is_redriven_after_the_cooldown(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    """A redrive key is one pass's claim for a cooldown, not for ever: the same observed queue
    state whose redriven delivery was lost too (Temporal lost it again, or the claiming process
    died before starting it) is delivered by a later pass, never left queued."""
    async with running_stack(client, fresh_store, fresh_db, queues=(), dispatcher=False) as s:
        job = (await put(fresh_store, payload_extra=task("true"))).job
        redrive = QueuedRedrive(fresh_store, s.starter, s.settings, NOW)
        for generation in (0, 1):  # delivered, then lost: twice on one observed state
            assert (await redrive.run_once()).redriven == 1
            await wait_for_scheduled_attempt(client, job.job_id, "attempt:1")
            latest = (await deliveries.job_and_latest(fresh_store, job.job_id))[1]
            assert latest is not None and latest.generation == generation
            await client.get_workflow_handle(latest.workflow_id).terminate("test: lost")
        # A pass that claimed the state and died before starting anything.
        state = await fresh_store.get_job(job.job_id)
        assert state is not None and state.status == "queued"
        cooling = LoopSettings(redrive_min_age_ms=0, redrive_cooldown_ms=60_000)
        assert not await deliveries.claim_redrive(
            fresh_store, job.job_id, state.seq, state.attempt, cooldown_ms=60_000
        )  # within the cooldown the key is the other pass's
        assert (
            await QueuedRedrive(fresh_store, s.starter, s.settings, cooling).run_once()
        ).redriven == 0
        again_before = metrics.REDRIVES_AGAIN._value.get()
        assert (await redrive.run_once()).redriven == 1  # past it: delivered again
        assert metrics.REDRIVES_AGAIN._value.get() == again_before + 1
        await s.start_worker("receipt-codex")
        done = await wait_for_status(fresh_store, job.job_id)
    assert done.status == "completed"
    latest = (await deliveries.job_and_latest(fresh_store, job.job_id))[1]
    assert latest is not None and latest.generation == 2


async def test_a_terminal_state_written_outside_a_driver_gets_its_callback_once(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    import httpx

    from tests.integration.delivery.receiver import Receiver

    async with (
        Receiver() as receiver,
        running_stack(
            client,
            fresh_store,
            fresh_db,
            queues=(),
            dispatcher=False,
            RECEIPT_EVENT_CALLBACK_URL=receiver.url,
        ) as s,
    ):
        session = "callback-session"
        job = (await put(fresh_store, sessionKey=session, payload_extra=task("true"))).job
        # A singleton cancel cancels the queued job: no driver ever sees it settle.
        await put(
            fresh_store, sessionKey=session, singletonMode="cancel", payload_extra=task("true")
        )
        async with httpx.AsyncClient() as http:
            passes = [
                QueuedRedrive(fresh_store, None, s.settings, NOW, http=http) for _ in range(2)
            ]
            results = await asyncio.gather(*(p.run_once() for p in passes))
        await receiver.wait_for(1)
    assert sum(r.callbacks for r in results) == 1
    bodies = [json.loads(r.body) for r in receiver.requests]
    assert [(b["event"], b["job"]["jobId"]) for b in bodies] == [("canceled", job.job_id)]


async def test_one_recovery_pass_goes_through_more_than_one_batch_of_owed_callbacks(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    """Only the driver recovers callbacks: a pass that finds a full batch due goes on to the
    next (bounded), so a backlog drains faster than 200 per interval."""
    import httpx
    import psycopg

    from roles.delivery.loops import REDRIVE_BATCH

    owed = REDRIVE_BATCH + 50
    with psycopg.connect(fresh_db) as conn:  # owed rows whose posts will fail (no such job)
        conn.execute(
            "INSERT INTO callback_outbox (job_id, event) "
            "SELECT 'gone-' || n, 'completed' FROM generate_series(1, %s) AS n",
            (owed,),
        )
    async with running_stack(
        client,
        fresh_store,
        fresh_db,
        queues=(),
        dispatcher=False,
        RECEIPT_EVENT_CALLBACK_URL="http://127.0.0.1:9/down",
    ) as s:
        async with httpx.AsyncClient() as http:
            await QueuedRedrive(fresh_store, None, s.settings, NOW, http=http).run_once()
    # Every row was looked at in the one pass (each moved 30 s on): none is due now.
    assert await callbacks_owed(fresh_store, (), limit=owed) == []


async def test_a_receiver_that_never_answers_holds_a_pass_for_its_budget_not_for_every_post(
    client: Client, fresh_store: Store, fresh_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Owed callbacks were posted one after another in the pass that also expires leases and
    redrives jobs: to a receiver that accepts and never answers, each cost its tries of 5 s, so
    200 of them held that pass (and its lease expiry and redrive) for hours. They go 8 at a time
    now, and none is started once the pass has spent its budget: the rest wait for the next."""
    import httpx

    from activities import driver as driver_activities
    from roles.delivery import loops

    monkeypatch.setattr(driver_activities, "CALLBACK_TRIES", 1)  # one 5 s timeout per post
    monkeypatch.setattr(loops, "CALLBACK_PASS_BUDGET_S", 1.0)
    held: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accepted, never answered

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
    try:
        async with running_stack(
            client, fresh_store, fresh_db, queues=(), dispatcher=False,
            RECEIPT_EVENT_CALLBACK_URL=url,
        ) as s:  # fmt: skip
            jobs = [(await put(fresh_store)).job for _ in range(20)]
            for job in jobs:  # settled outside a driver: each owes its terminal callback
                await ops.cancel_queued(fresh_store, job.job_id, reason="test")
            assert len(await callbacks_owed(fresh_store, (), limit=50)) == 20
            async with httpx.AsyncClient() as http:
                redrive = QueuedRedrive(fresh_store, None, s.settings, NOW, http=http)
                # Twenty posts one after another: 100 s. Eight at once, then the budget: 5 s.
                await asyncio.wait_for(redrive.run_once(), 30)
            left = await callbacks_owed(fresh_store, (), limit=50)
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
    assert len(held) == 8  # the first eight were posted; none was started past the budget
    assert len(left) == 20 - 8  # the others are owed to the next pass


async def test_a_draining_role_claims_no_owed_callback_and_cuts_what_outlives_the_grace(
    client: Client,
    fresh_store: Store,
    fresh_db: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Once the role's `stop` is set, the recovery claims no owed callback (one waiting for
    its turn is left to another driver), and `drain` gives the post in flight the grace, then
    cuts it (logged `callback.drain_cut`), its claim given back for another driver at once."""
    import httpx

    from roles.delivery import loops

    monkeypatch.setattr(loops, "CALLBACK_POSTS_AT_ONCE", 1)
    held: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accepted, never answered

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
    stop = asyncio.Event()
    try:
        async with running_stack(
            client, fresh_store, fresh_db, queues=(), dispatcher=False,
            RECEIPT_EVENT_CALLBACK_URL=url,
        ) as s:  # fmt: skip
            jobs = [(await put(fresh_store)).job for _ in range(2)]
            for job in jobs:  # settled outside a driver: each owes its terminal callback
                await ops.cancel_queued(fresh_store, job.job_id, reason="test")
            async with httpx.AsyncClient() as http:
                redrive = QueuedRedrive(fresh_store, None, s.settings, NOW, http=http, stop=stop)
                passing = asyncio.create_task(redrive.run_once())
                for _ in range(200):  # the first post reaches the receiver
                    if held:
                        break
                    await asyncio.sleep(0.05)
                stop.set()
                started = asyncio.get_running_loop().time()
                await redrive.drain(0.5)
                drained_s = asyncio.get_running_loop().time() - started
                assert (await asyncio.wait_for(passing, 5)).callbacks == 0
            posts = {job_id: status for job_id, _, _, status in await callback_rows(fresh_store)}
            # The cut post's claim is given back: another driver claims it at once.
            cut = next(iter(posts))
            again = await deliveries.claim_callback(fresh_store, cut, "canceled", url)
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
    assert len(held) == 1
    assert 0.5 <= drained_s < 3
    assert list(posts.values()) == ["pending"]  # the other was never claimed
    assert again
    cuts = [r for r in caplog.records if getattr(r, "event", None) == "callback.drain_cut"]
    assert [getattr(r, "posts", None) for r in cuts] == [1]


async def callback_rows(store: Store) -> list[tuple[str, str, str, str]]:
    """`(jobId, event, url, status)` of every callback post claimed."""
    async with store.connection() as conn:
        cur = await conn.execute("SELECT job_id, event, url, status FROM callback_posts")
        return [(str(j), str(e), str(u), str(st)) for j, e, u, st in await cur.fetchall()]


async def test_a_role_that_posts_no_callbacks_leaves_the_owed_ones_alone(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    """A role outside CALLBACK_ROLES (no HTTP client) with no callback URL of its own must not
    drop what the driver, configured with one, owes."""
    import psycopg

    with psycopg.connect(fresh_db) as conn:
        conn.execute("INSERT INTO callback_outbox (job_id, event) VALUES ('owed-1', 'completed')")
    async with running_stack(client, fresh_store, fresh_db, queues=(), dispatcher=False) as s:
        assert not s.settings.callback_urls
        await QueuedRedrive(fresh_store, None, s.settings, NOW, http=None).run_once()
    assert await callbacks_owed(fresh_store, (), limit=10) == [("owed-1", "completed")]


async def test_a_rescan_goes_on_while_its_batches_come_back_full(
    client: Client, fresh_store: Store, fresh_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backlog of never-dispatched jobs (left by a driver outage) drained one batch of 500 a
    minute, the idle rescan's pace: a full batch that started something is followed by the next."""
    from roles.delivery import dispatcher as dispatching

    monkeypatch.setattr(dispatching, "RESCAN_BATCH", 2)
    async with running_stack(client, fresh_store, fresh_db, queues=(), dispatcher=False) as s:
        # Five organizations: none is held back by its share of the codex workers.
        jobs = [
            (await put(fresh_store, org=f"org-{n}", payload_extra=task("true"))).job
            for n in range(5)
        ]
        rescanning = dispatching.Dispatcher(fresh_store, s.listener, s.starter)
        await rescanning._rescan()
        latest = [(await deliveries.job_and_latest(fresh_store, j.job_id))[1] for j in jobs]
    assert all(record is not None and record.generation == 0 for record in latest)


async def test_a_pass_that_fails_after_expiring_leases_still_counts_them(
    client: Client, fresh_store: Store, fresh_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The expiries and redrives of a pass were counted at its end: a failure after them (the
    callback recovery) lost their counts, and ReceiptLeaseExpiries read fewer than happened."""
    async with running_stack(client, fresh_store, fresh_db, queues=(), dispatcher=False) as s:
        jobs = [(await put(fresh_store, maxAttempts=2)).job for _ in range(3)]
        for job in jobs:
            leased = await ops.lease(fresh_store, job.job_id, attempt=1, worker_id="d", lease_ms=1)
            assert leased.ok
        await asyncio.sleep(0.05)
        redrive = QueuedRedrive(fresh_store, None, s.settings, NOW)

        async def callbacks_away() -> int:
            raise RuntimeError("callback recovery failed")

        monkeypatch.setattr(redrive, "_recover_callbacks", callbacks_away)
        before = metrics.value("receipt_lease_expirations_total")
        with pytest.raises(RuntimeError):
            await redrive.run_once()
    assert metrics.value("receipt_lease_expirations_total") == before + 3


async def test_a_driver_start_that_fails_is_counted(
    client: Client, fresh_store: Store, fresh_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start that raised (Temporal away, a database error) was logged by its caller and
    counted nowhere: `receipt_driver_starts{outcome="failed"}`."""
    async with running_stack(client, fresh_store, fresh_db, queues=(), dispatcher=False) as s:
        job = (await put(fresh_store)).job

        async def temporal_away(job_id: str) -> Any:
            raise RuntimeError("temporal away")

        monkeypatch.setattr(s.starter, "_start", temporal_away)
        before = metrics.value("receipt_driver_starts_total", outcome="failed")
        with pytest.raises(RuntimeError):
            await s.starter.start(job.job_id)
    assert metrics.value("receipt_driver_starts_total", outcome="failed") == before + 1


def test_the_redrive_makes_its_first_pass_5_s_after_start() -> None:
    """The spec's queued redrive first runs 5 000 ms after its role starts, then every
    15 000 ms (J45): the loop every role starts (`serve.start_loops`) is `ticker()`."""
    from receipts.settings import Settings

    redrive = QueuedRedrive(None, None, Settings())  # type: ignore[arg-type]
    ticker = redrive.ticker()
    assert (ticker.first_delay_ms, ticker.interval_ms) == (5_000, 15_000)
    assert ticker.name == "queued_redrive"


async def test_a_start_that_failed_is_tried_again_in_seconds_not_at_the_idle_rescan(
    client: Client, fresh_store: Store, fresh_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start that failed (Temporal away) was tried again only by the redrive (30 s after the
    job's last receipt, a pass every 15 s) or the idle rescan (60 s): a job enqueued during a
    Temporal outage waited that long after Temporal came back. The dispatcher rescans soon."""
    from roles.delivery import dispatcher as dispatching

    async with running_stack(client, fresh_store, fresh_db, queues=(), dispatcher=False) as s:
        real_start = s.starter._start
        tries: list[str] = []

        async def away_once(job_id: str) -> Any:
            tries.append(job_id)
            if len(tries) == 1:
                raise RuntimeError("temporal away")
            return await real_start(job_id)

        monkeypatch.setattr(s.starter, "_start", away_once)
        running = asyncio.create_task(
            dispatching.Dispatcher(fresh_store, s.listener, s.starter).run()
        )
        try:
            await asyncio.sleep(0.3)  # its first rescan found nothing
            job = (await put(fresh_store, payload_extra=task("true"))).job
            for _ in range(50):
                if (await deliveries.job_and_latest(fresh_store, job.job_id))[1] is not None:
                    break
                await asyncio.sleep(0.1)
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
    assert tries[:2] == [job.job_id, job.job_id]
    assert (await deliveries.job_and_latest(fresh_store, job.job_id))[1] is not None


async def test_a_lost_delivery_behind_more_open_ones_than_a_pass_takes_is_redriven(
    client: Client, fresh_store: Store, fresh_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every queued job is looked at within a bounded number of passes. A pass took the first
    REDRIVE_BATCH candidates of the whole queue, and the jobs whose open delivery it found came
    back after their cooldown, first again: with more queued jobs waiting on busy workers than
    two passes take, a job further back whose delivery Temporal lost was never redriven. Now each
    pass goes on from where the last one's page ended."""
    from roles.delivery import loops

    monkeypatch.setattr(loops, "REDRIVE_BATCH", 2)
    monkeypatch.setattr(loops, "REDRIVE_PAGE", 2, raising=False)
    async with running_stack(client, fresh_store, fresh_db, queues=(), dispatcher=False) as s:
        # Five organizations: none is held back by its share of the codex workers.
        jobs = [
            (await put(fresh_store, org=f"org-{n}", payload_extra=task("true"))).job
            for n in range(5)
        ]
        for job in jobs:  # delivered, waiting for a worker (none runs)
            assert (await s.starter.start(job.job_id)).created
        lost = jobs[-1]
        await wait_for_scheduled_attempt(client, lost.job_id, "attempt:1")
        await client.get_workflow_handle(lost.job_id).terminate("test: the delivery is lost")
        redrive = QueuedRedrive(fresh_store, s.starter, s.settings, NOW)
        redriven = [(await redrive.run_once()).redriven for _ in range(3)]  # 5 jobs, 2 a pass
        assert sum(redriven) == 1, redriven
        latest = (await deliveries.job_and_latest(fresh_store, lost.job_id))[1]
        assert latest is not None and latest.generation == 1
