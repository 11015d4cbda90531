"""The terminal-callback outbox: written in the transaction that settles a job, read by the
recovery pass instead of a scan of every settled job, emptied once every URL has its post; and
the application's connection settings (no JIT, the api's statement timeout, no generic plan of
the job list)."""

from __future__ import annotations

import json

import httpx
import pytest
from temporalio.testing import ActivityEnvironment

from activities.driver import DriverActivities
from receipts import assembly, deliveries, metrics
from receipts import operations as ops
from receipts.errors import TransientStorageError
from receipts.messages import CallbackRequest
from receipts.settings import Settings
from receipts.store import Store
from receipts.timing import TimingSettings
from roles.delivery.loops import QueuedRedrive
from roles.infra.db import open_store
from roles.infra.settings import LoopSettings
from tests.integration.api_support import AS_A, api_client
from tests.integration.delivery.receiver import Receiver
from tests.integration.helpers import callbacks_owed, put

NOW = LoopSettings(redrive_min_age_ms=0, redrive_cooldown_ms=0)
CLOSED = "http://127.0.0.1:9/closed"  # nothing listens on the discard port


async def settled(store: Store, how: str) -> str:
    job = (await put(store)).job
    if how == "canceled":
        await ops.cancel_queued(store, job.job_id, reason="test")
        return job.job_id
    worker = f"{job.job_id}:attempt:1/1"
    await ops.start_attempt(store, job.job_id, attempt=1, worker_id=worker, lease_ms=60_000)
    await ops.complete(store, job.job_id, worker_id=worker, attempt=1, result=1)
    return job.job_id


async def posted_dispatched(store: Store, job_id: str, url: str) -> None:
    assert await deliveries.claim_callback(store, job_id, "dispatched", url)
    await deliveries.callback_result(store, job_id, "dispatched", url, "posted", None)


async def test_a_terminal_callback_waits_for_the_dispatched_post_its_driver_owes(
    fresh: tuple[Store, str],
) -> None:
    """The driver posts `dispatched` beside the attempt: a quick job settles first, and the
    recovery loop posted the owed `completed` at once, before `dispatched` reached the
    receiver. It waits while a URL has no `dispatched` posted or given up, at most
    DISPATCHED_WAIT_S after the job settled; a job that never ran an attempt waits for none."""
    store, _ = fresh
    urls = ("https://a.example/cb", "https://b.example/cb")
    done = await settled(store, "completed")
    canceled = await settled(store, "canceled")  # never dispatched: owes no `dispatched`
    assert await callbacks_owed(store, urls) == [(canceled, "canceled")]
    # A job still waiting is looked at again in 5 s (its row leaves the head of the due index).
    assert await callbacks_owed(store, urls) == [(canceled, "canceled")]
    assert await seconds_until_due(store, done) > 4
    await posted_dispatched(store, done, urls[0])
    await all_due(store)
    assert (done, "completed") not in await callbacks_owed(store, urls)
    assert await deliveries.claim_callback(store, done, "dispatched", urls[1])  # in flight
    await all_due(store)
    assert (done, "completed") not in await callbacks_owed(store, urls)
    await deliveries.callback_result(store, done, "dispatched", urls[1], "failed", "HTTP 500")
    await all_due(store)
    assert (done, "completed") in await callbacks_owed(store, urls)  # given up

    gone = await settled(store, "completed")  # its driver never posts `dispatched`
    assert (gone, "completed") not in await callbacks_owed(store, urls)
    await _age(store, gone, deliveries.DISPATCHED_WAIT_S + 1)
    await all_due(store)
    assert (gone, "completed") in await callbacks_owed(store, urls)


async def all_due(store: Store) -> None:
    """The outbox's rows due now, as 5 s later."""
    async with store.connection() as conn:
        await conn.execute("UPDATE callback_outbox SET due_at = now()")


async def seconds_until_due(store: Store, job_id: str) -> float:
    async with store.connection() as conn:
        cur = await conn.execute(
            "SELECT extract(epoch FROM due_at - now()) FROM callback_outbox WHERE job_id = %s",
            (job_id,),
        )
        row = await cur.fetchone()
    assert row is not None
    return float(row[0])


async def test_a_settlement_owes_its_callback_until_every_url_has_it(
    fresh: tuple[Store, str],
) -> None:
    store, _ = fresh
    queued = (await put(store)).job
    done = await settled(store, "completed")
    canceled = await settled(store, "canceled")
    owed = await callbacks_owed(store, ())
    assert sorted(owed) == sorted([(done, "completed"), (canceled, "canceled")])
    assert queued.job_id not in {job_id for job_id, _ in owed}

    def counted(event: str, outcome: str) -> float:
        return metrics.value("receipt_callbacks_total", event=event, outcome=outcome)

    before = {
        (e, o): counted(e, o) for e in ("completed", "canceled") for o in ("posted", "failed")
    }
    async with Receiver() as receiver, httpx.AsyncClient() as http:
        both = Settings(
            RECEIPT_EVENT_CALLBACK_URL=receiver.url, RECEIPT_RESONATE_CALLBACK_URL=CLOSED
        )
        for url in both.callback_urls:  # the driver posted `dispatched` before it settled
            await posted_dispatched(store, done, url)
        first = await QueuedRedrive(store, None, both, NOW, http=http).run_once()
        # Posted to the receiver; the closed URL failed, so both stay owed (due again later).
        assert first.callbacks == 2
        for event in ("completed", "canceled"):  # counted per URL: one posted, one failed
            for outcome in ("posted", "failed"):
                assert counted(event, outcome) - before[event, outcome] == 1
        assert await callbacks_owed(store, ()) == []
        posted = [json.loads(r.body) for r in receiver.requests]
        bodies = sorted((b["event"], b["job"]["jobId"]) for b in posted)
        assert bodies == sorted([("completed", done), ("canceled", canceled)])

        only_receiver = Settings(RECEIPT_EVENT_CALLBACK_URL=receiver.url)
        assert await deliveries.settle_owed_callback(store, done, only_receiver.callback_urls)
        assert not await deliveries.settle_owed_callback(store, canceled, both.callback_urls)
        again = await QueuedRedrive(store, None, only_receiver, NOW, http=http).run_once()
        assert again.callbacks == 0  # due later: nothing posted twice
        assert len(receiver.requests) == 2


async def test_without_callback_urls_nothing_stays_owed(fresh: tuple[Store, str]) -> None:
    store, _ = fresh
    await settled(store, "completed")
    assert len(await callbacks_owed(store, ())) == 1
    # The driver's pass (the roles that post callbacks hold an HTTP client) drops them.
    async with httpx.AsyncClient() as http:
        await QueuedRedrive(store, None, Settings(), NOW, http=http).run_once()
    assert await callbacks_owed(store, ()) == []


async def test_every_connection_runs_without_jit_and_the_api_with_a_statement_timeout(
    fresh: tuple[Store, str],
) -> None:
    store, url = fresh
    async with store.connection() as conn:
        row = await (await conn.execute("SELECT current_setting('jit')")).fetchone()
    assert row == ("off",)
    api = await open_store(url, Settings(RECEIPT_API_STATEMENT_TIMEOUT_MS=200), api=True)
    try:
        async with api.connection() as conn:
            row = await (
                await conn.execute("SELECT current_setting('statement_timeout')")
            ).fetchone()
        assert row == ("200ms",)
        with pytest.raises(TransientStorageError):  # the api answers it with 503
            async with api.connection() as conn:
                await conn.execute("SELECT pg_sleep(2)")
    finally:
        await api.close()


async def test_the_job_list_is_never_a_generic_prepared_plan(fresh: tuple[Store, str]) -> None:
    _, url = fresh
    single = await assembly.open_store(
        url, min_size=1, max_size=1
    )  # every request on one connection
    try:
        async with api_client(url, store=single) as client:
            for lane in ("steer", "chat") * 6:
                assert (await client.get(f"/jobs?lane={lane}", headers=AS_A)).status_code == 200
        async with single.connection() as conn:
            cur = await conn.execute("SELECT statement FROM pg_prepared_statements")
            prepared = [row[0] for row in await cur.fetchall()]
    finally:
        await single.close()
    assert not [s for s in prepared if "job_leases" in s], prepared


async def _age(store: Store, job_id: str, seconds: int) -> None:
    async with store.connection() as conn:
        await conn.execute(
            "UPDATE jobs SET updated_at = now() - make_interval(secs => %s) WHERE job_id = %s",
            (seconds, job_id),
        )


async def test_a_dispatched_post_made_late_never_reaches_a_receiver_after_the_terminal(
    fresh: tuple[Store, str],
) -> None:
    """The driver's `dispatched` activity is still queued (its worker's activity slots busy
    with a slow receiver's posts; schedule-to-start is bounded only by the run) or retrying
    when DISPATCHED_WAIT_S has passed since the job settled: the recovery loop posts
    `completed`, and the driver's post of `dispatched` then reaches the receiver after it."""
    store, _ = fresh
    done = await settled(store, "completed")  # ran attempt 1; its driver's post still queued
    await _age(store, done, deliveries.DISPATCHED_WAIT_S + 1)
    async with Receiver() as receiver, httpx.AsyncClient() as http:
        settings = Settings(RECEIPT_EVENT_CALLBACK_URL=receiver.url)  # type: ignore[call-arg]
        await QueuedRedrive(store, None, settings, NOW, http=http).run_once()  # recovery pass
        driver = DriverActivities(store, settings, TimingSettings(), http)
        # The driver's queued `dispatched` activity starts now (its first try).
        await ActivityEnvironment().run(driver.post_callbacks, CallbackRequest(done, "dispatched"))
    heard = [json.loads(r.body)["event"] for r in receiver.requests]
    # Never `dispatched` after `completed` (here: not at all, the terminal went first).
    assert heard == ["completed"], heard


async def test_an_in_flight_dispatched_post_holds_the_owed_terminal_post(
    fresh: tuple[Store, str],
) -> None:
    """The driver's `dispatched` post is claimed and in flight (status pending, claimed just
    now): past DISPATCHED_WAIT_S the recovery loop returns it as owed anyway."""
    store, _ = fresh
    done = await settled(store, "completed")
    url = "https://a.example/cb"
    assert await deliveries.claim_callback(store, done, "dispatched", url)  # in flight
    await _age(store, done, deliveries.DISPATCHED_WAIT_S + 1)
    assert (done, "completed") not in await callbacks_owed(store, (url,))


async def test_a_due_callback_behind_many_waiting_ones_is_reached(
    fresh: tuple[Store, str],
) -> None:
    """A read takes five times its limit of due rows; those still waiting for `dispatched` are
    put back 5 s and the read says more may be due, so the next one reaches the rows behind
    them (the recovery pass reads on while it does) instead of reading every waiting row."""
    store, _ = fresh
    urls = ("https://a.example/cb",)
    waiting = [await settled(store, "completed") for _ in range(6)]
    canceled = await settled(store, "canceled")  # due after them; waits for nothing
    owed, more = await deliveries.owed_callbacks(store, urls, limit=1)  # reads 5 rows
    assert (owed, more) == ([], True)
    owed, _ = await deliveries.owed_callbacks(store, urls, limit=1)
    assert owed == [(canceled, "canceled")]
    assert all([await seconds_until_due(store, job_id) > 0 for job_id in waiting])


async def _claimed(store: Store, job_id: str, event: str) -> bool:
    async with store.connection() as conn:
        cur = await conn.execute(
            "SELECT 1 FROM callback_posts WHERE job_id = %s AND event = %s", (job_id, event)
        )
        return await cur.fetchone() is not None


async def test_a_terminal_post_never_overtakes_a_dispatched_post_claimed_after_its_read(
    fresh: tuple[Store, str],
) -> None:
    """The recovery loop read the job's terminal callback as owed (nothing of its `dispatched`
    claimed yet: the job was canceled queued as its driver dispatched it, or settled
    DISPATCHED_WAIT_S ago), and the driver's `dispatched` activity then claimed its post. The
    recovery's post of the terminal, claimed later (behind CALLBACK_POSTS_AT_ONCE, the job's
    read), went all the same, and a receiver slow to answer `dispatched` heard the terminal
    first. The claim itself waits for a `dispatched` in flight to the same URL."""
    import asyncio

    from activities.driver import post_callbacks
    from tests.eventually import eventually

    store, _ = fresh
    job_id = await settled(store, "canceled")
    async with Receiver(hold={"dispatched": 1.0}) as receiver, httpx.AsyncClient() as http:
        settings = Settings(RECEIPT_EVENT_CALLBACK_URL=receiver.url)
        # The recovery pass reads what is owed.
        assert (job_id, "canceled") in await callbacks_owed(store, settings.callback_urls)
        # The driver's `dispatched` activity starts and claims its post.
        driver = DriverActivities(store, settings, TimingSettings(), http)
        request = CallbackRequest(job_id, "dispatched")
        dispatched = asyncio.create_task(ActivityEnvironment().run(driver.post_callbacks, request))
        await eventually(lambda: _claimed(store, job_id, "dispatched"), what="the dispatched claim")
        # The recovery pass goes on with the row it read (`QueuedRedrive` `recover`).
        job = await store.get_job(job_id)
        assert job is not None
        await post_callbacks(store, settings, http, job, "canceled")
        await dispatched
        await all_due(store)  # a later pass: the terminal post, if still owed
        await QueuedRedrive(store, None, settings, NOW, http=http).run_once()
    heard = [json.loads(r.body)["event"] for r in receiver.requests]
    assert heard == ["dispatched", "canceled"], heard
