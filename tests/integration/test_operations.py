"""Fenced operations against real PostgreSQL: every rejection writes nothing."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from receipts import operations as ops
from receipts.store import Store
from tests.integration.helpers import put, types

LEASE = 60_000


async def leased(store: Store, max_attempts: int = 2, worker: str = "w1") -> str:
    job = (await put(store, maxAttempts=max_attempts)).job
    assert (await ops.lease(store, job.job_id, attempt=1, worker_id=worker, lease_ms=LEASE)).ok
    return job.job_id


async def test_happy_path_receipt_sequence(store: Store) -> None:
    job_id = await leased(store)
    hb = await ops.heartbeat(store, job_id, worker_id="w1", attempt=1, lease_ms=LEASE)
    assert hb.ok and hb.job is not None and hb.job.status == "running"
    assert (await ops.progress(store, job_id, worker_id="w1", attempt=1, data={"p": 1})).ok
    done = await ops.complete(store, job_id, worker_id="w1", attempt=1, result={"ok": True})
    assert done.ok and done.job is not None and done.job.status == "completed"
    assert done.job.result == {"ok": True}
    assert await types(store, job_id) == [
        "job.enqueued",
        "job.leased",
        "job.heartbeat",
        "job.progress",
        "job.completed",
    ]


async def test_a_non_finite_number_a_handler_hands_back_is_written_as_null(store: Store) -> None:
    """NaN and ±Infinity (Python's json writes them; jsonb refuses them): a progress or a result
    holding one is written with null in its place, not refused by the database at every
    delivery, the handler run again each time."""
    job_id = await leased(store)
    progress = {"eta": float("inf"), "steps": [1.5, float("-inf")]}
    assert (await ops.progress(store, job_id, worker_id="w1", attempt=1, data=progress)).ok
    result = {"ratio": float("nan"), "n": 2}
    done = await ops.complete(store, job_id, worker_id="w1", attempt=1, result=result)
    assert done.ok and done.job is not None and done.job.result == {"ratio": None, "n": 2}
    stored = await store.read_stream(f"jobs/{job_id}")
    assert stored[-2].data["data"] == {"eta": None, "steps": [1.5, None]}


async def test_lease_sets_expiry_from_the_database_clock(store: Store) -> None:
    job = (await put(store)).job
    before = await store.now()
    out = await ops.lease(store, job.job_id, attempt=1, worker_id="w", lease_ms=LEASE)
    assert out.job is not None and out.job.lease is not None
    expires = out.job.lease.expires_at - before
    assert timedelta(milliseconds=LEASE) <= expires < timedelta(milliseconds=LEASE + 5_000)


async def test_lease_only_for_the_expected_attempt(store: Store) -> None:
    job = (await put(store)).job
    for attempt in (0, 2, 3):
        out = await ops.lease(store, job.job_id, attempt=attempt, worker_id="w", lease_ms=LEASE)
        assert not out.ok
    assert await types(store, job.job_id) == ["job.enqueued"]
    assert (await ops.lease(store, job.job_id, attempt=1, worker_id="w", lease_ms=LEASE)).ok
    second = await ops.lease(store, job.job_id, attempt=1, worker_id="w2", lease_ms=LEASE)
    assert second.status == "stale_attempt"
    assert await types(store, job.job_id) == ["job.enqueued", "job.leased"]


async def test_start_fence_rebinds_and_the_earlier_delivery_is_rejected(store: Store) -> None:
    job_id = await leased(store, worker="j:attempt:1/1")
    rebound = await ops.heartbeat(
        store, job_id, worker_id="j:attempt:1/2", attempt=1, lease_ms=LEASE, start_fence=True
    )
    assert rebound.ok and rebound.job is not None and rebound.job.lease is not None
    assert rebound.job.lease.worker_id == "j:attempt:1/2"
    written = await types(store, job_id)
    old = "j:attempt:1/1"
    rejected = [
        await ops.heartbeat(store, job_id, worker_id=old, attempt=1, lease_ms=LEASE),
        await ops.progress(store, job_id, worker_id=old, attempt=1, data={}),
        await ops.complete(store, job_id, worker_id=old, attempt=1),
        await ops.fail(store, job_id, worker_id=old, attempt=1, error="x", retryable=False),
        await ops.cancel(store, job_id, worker_id=old, attempt=1, reason="x"),
    ]
    assert [r.status for r in rejected] == ["lease_lost"] * 5
    assert await types(store, job_id) == written
    assert (await ops.complete(store, job_id, worker_id="j:attempt:1/2", attempt=1)).ok


async def test_start_fence_for_another_attempt_is_inert(store: Store) -> None:
    job_id = await leased(store)
    out = await ops.heartbeat(
        store, job_id, worker_id="other", attempt=2, lease_ms=LEASE, start_fence=True
    )
    assert not out.ok
    assert await types(store, job_id) == ["job.enqueued", "job.leased"]


async def test_expired_lease_rejects_writes_and_expiry_requeues(store: Store) -> None:
    job = (await put(store)).job
    assert (await ops.lease(store, job.job_id, attempt=1, worker_id="w1", lease_ms=1)).ok
    await asyncio.sleep(0.01)
    late = await ops.heartbeat(store, job.job_id, worker_id="w1", attempt=1, lease_ms=LEASE)
    assert late.status == "lease_lost"
    expired = await ops.expire_lease(store, job.job_id)
    assert expired.ok and expired.job is not None and expired.job.status == "queued"
    assert (await ops.lease(store, job.job_id, attempt=2, worker_id="w2", lease_ms=LEASE)).ok
    # Every late write of the first attempt is rejected as stale and writes nothing.
    before = await types(store, job.job_id)
    for out in (
        await ops.heartbeat(store, job.job_id, worker_id="w1", attempt=1, lease_ms=LEASE),
        await ops.complete(store, job.job_id, worker_id="w1", attempt=1),
        await ops.progress(store, job.job_id, worker_id="w1", attempt=1, data=1),
    ):
        assert out.status == "stale_attempt"
    assert await types(store, job.job_id) == before
    assert (await ops.complete(store, job.job_id, worker_id="w2", attempt=2)).ok


async def test_expire_lease_refuses_a_live_lease(store: Store) -> None:
    job_id = await leased(store)
    assert (await ops.expire_lease(store, job_id)).status == "not_expired"
    assert await types(store, job_id) == ["job.enqueued", "job.leased"]


async def test_retryable_failure_requeues_then_exhausts(store: Store) -> None:
    job_id = await leased(store, max_attempts=2)
    first = await ops.fail(store, job_id, worker_id="w1", attempt=1, error="boom", retryable=True)
    assert first.job is not None and first.job.status == "queued"
    assert (await ops.lease(store, job_id, attempt=2, worker_id="w2", lease_ms=LEASE)).ok
    last = await ops.fail(
        store, job_id, worker_id="w2", attempt=2, error="boom", retryable=True, status="failed"
    )
    assert last.job is not None and last.job.status == "failed"
    assert last.job.result is None  # a retryable failure does not copy its status


async def test_non_retryable_failure_copies_its_status_onto_the_result(store: Store) -> None:
    job_id = await leased(store)
    out = await ops.fail(
        store,
        job_id,
        worker_id="w1",
        attempt=1,
        error="too slow",
        retryable=False,
        status="execution_timeout",
    )
    assert out.job is not None and out.job.status == "failed"
    assert out.job.result == {"status": "execution_timeout"}


async def test_graceful_release_refunds_the_attempt(store: Store) -> None:
    job_id = await leased(store, max_attempts=1)
    out = await ops.fail(
        store,
        job_id,
        worker_id="w1",
        attempt=1,
        error="worker shutdown",
        retryable=True,
        refund_attempt=True,
    )
    assert out.job is not None and (out.job.status, out.job.attempt) == ("queued", 0)
    assert (await ops.lease(store, job_id, attempt=1, worker_id="w2", lease_ms=LEASE)).ok


async def test_settle_retry_after_an_ambiguous_commit_reports_success(store: Store) -> None:
    job_id = await leased(store)
    first = await ops.complete(store, job_id, worker_id="w1", attempt=1, result=1)
    retry = await ops.complete(store, job_id, worker_id="w1", attempt=1, result=1)
    assert first.ok and retry.ok and retry.already
    other = await ops.complete(store, job_id, worker_id="w2", attempt=1, result=1)
    assert other.status == "terminal_state"
    assert (await types(store, job_id)).count("job.completed") == 1


async def test_consumed_commands_become_pending_again_after_a_failed_attempt(
    store: Store,
) -> None:
    job_id = await leased(store)
    sent = await ops.add_command(
        store, job_id, type="steer", payload={"say": "hi"}, organization_id="org-a"
    )
    assert sent.ok and sent.job is not None
    command_id = sent.job.commands[-1].command_id
    consumed = await ops.consume_command(
        store, job_id, worker_id="w1", attempt=1, command_id=command_id
    )
    assert consumed.job is not None and consumed.job.pending_commands == ()
    again = await ops.consume_command(
        store, job_id, worker_id="w1", attempt=1, command_id=command_id
    )
    assert again.status == "not_pending"
    requeued = await ops.fail(store, job_id, worker_id="w1", attempt=1, error="x", retryable=True)
    assert requeued.job is not None
    assert [c.command_id for c in requeued.job.pending_commands] == [command_id]


async def test_a_takeover_finds_pending_what_the_delivery_before_it_consumed(
    store: Store,
) -> None:
    """A delivery that took the lease over runs its handler from the start: a steer the
    delivery before it consumed is pending again for it (as after a requeue), not lost with the
    dead delivery's handler; the superseded delivery consumes nothing more."""
    job_id = await leased(store, worker="j:attempt:1/1")
    sent = await ops.add_command(
        store, job_id, type="steer", payload={"say": "hi"}, organization_id="org-a"
    )
    assert sent.job is not None
    command_id = sent.job.commands[-1].command_id
    first = await ops.consume_command(
        store, job_id, worker_id="j:attempt:1/1", attempt=1, command_id=command_id
    )
    assert first.job is not None and first.job.pending_commands == ()
    # The same delivery's start fence said again (its own lease): nothing comes back.
    same = await ops.heartbeat(
        store, job_id, worker_id="j:attempt:1/1", attempt=1, lease_ms=LEASE, start_fence=True
    )
    assert same.job is not None and same.job.pending_commands == ()
    taken = await ops.heartbeat(
        store, job_id, worker_id="j:attempt:1/2", attempt=1, lease_ms=LEASE, start_fence=True
    )
    assert taken.job is not None
    assert [c.command_id for c in taken.job.pending_commands] == [command_id]
    stale = await ops.consume_command(
        store, job_id, worker_id="j:attempt:1/1", attempt=1, command_id=command_id
    )
    assert stale.status == "lease_lost"
    again = await ops.consume_command(
        store, job_id, worker_id="j:attempt:1/2", attempt=1, command_id=command_id
    )
    assert again.ok and again.job is not None and again.job.pending_commands == ()
    job = await store.get_job(job_id)
    assert job is not None and job.pending_commands == ()


async def test_command_on_a_terminal_job_is_refused(store: Store) -> None:
    job = (await put(store)).job
    assert (await ops.cancel_queued(store, job.job_id, reason="stop")).ok
    out = await ops.add_command(store, job.job_id, type="abort", organization_id="org-a")
    assert out.status == "terminal_state"
    assert await types(store, job.job_id) == ["job.enqueued", "job.canceled"]


async def test_command_for_another_organization_is_not_found(store: Store) -> None:
    job = (await put(store)).job
    out = await ops.add_command(store, job.job_id, type="abort", organization_id="org-b")
    assert out.status == "not_found"
    assert await types(store, job.job_id) == ["job.enqueued"]


async def test_fail_stale_uses_the_stale_lease_fence(store: Store) -> None:
    job_id = await leased(store)
    fresh = await ops.fail_stale(store, job_id, active_stale_ms=600_000, error="stale")
    assert fresh.status == "not_stale"
    await asyncio.sleep(0.02)
    stale = await ops.fail_stale(store, job_id, active_stale_ms=1, error="stale")
    assert stale.ok and stale.job is not None and stale.job.status == "queued"
    assert stale.receipts[0].data["workerId"] == "w1"


async def test_fail_undeliverable_is_a_system_failure_without_a_lease(store: Store) -> None:
    job = (await put(store)).job
    out = await ops.fail_undeliverable(store, job.job_id, error="gave up")
    assert out.job is not None and (out.job.status, out.job.error) == ("failed", "gave up")
    assert out.receipts[0].data["workerId"] is None


async def test_fail_undeliverable_uses_the_active_lease_fence(store: Store) -> None:
    job_id = await leased(store)
    out = await ops.fail_undeliverable(store, job_id, error="gave up")
    assert out.job is not None and out.job.status == "failed"
    assert out.receipts[0].data["workerId"] == "w1"


async def test_handler_text_is_sanitised_before_jsonb(store: Store) -> None:
    job_id = await leased(store)
    out = await ops.fail(
        store, job_id, worker_id="w1", attempt=1, error="bad \u0000 \ud800 bytes", retryable=False
    )
    assert out.ok and out.job is not None and out.job.error == "bad \ufffd \ufffd bytes"


async def test_abort_on_a_queued_job_cancels_it_at_once(store: Store) -> None:
    job = (await put(store)).job
    out = await ops.add_command(
        store, job.job_id, type="abort", reason="stop", organization_id="org-a"
    )
    assert out.ok and out.job is not None
    assert (out.job.status, out.job.canceled_reason) == ("canceled", "stop")
    assert await types(store, job.job_id) == ["job.enqueued", "queue.command", "job.canceled"]


async def test_abort_on_a_running_job_only_requests_it(store: Store) -> None:
    job_id = await leased(store)
    out = await ops.add_command(store, job_id, type="abort", reason="stop", organization_id="org-a")
    assert out.job is not None and out.job.status == "leased" and out.job.abort_requested


async def test_a_refunded_delivery_id_leasing_again_can_settle(store: Store) -> None:
    job_id = await leased(store, worker="j:attempt:1/1")
    released = await ops.fail(
        store,
        job_id,
        worker_id="j:attempt:1/1",
        attempt=1,
        error="worker shutdown",
        retryable=True,
        refund_attempt=True,
    )
    assert released.job is not None and released.job.attempt == 0
    again = await ops.lease(store, job_id, attempt=1, worker_id="j:attempt:1/1", lease_ms=LEASE)
    assert again.ok
    done = await ops.complete(store, job_id, worker_id="j:attempt:1/1", attempt=1)
    assert done.ok and not done.already and done.job is not None
    assert done.job.status == "completed"


async def test_a_retried_requeueing_failure_reports_success_once(store: Store) -> None:
    job_id = await leased(store)
    first = await ops.fail(store, job_id, worker_id="w1", attempt=1, error="x", retryable=True)
    retry = await ops.fail(store, job_id, worker_id="w1", attempt=1, error="x", retryable=True)
    assert first.ok and retry.ok and retry.already
    assert (await types(store, job_id)).count("job.failed") == 1


async def test_a_retried_lease_after_an_ambiguous_commit_is_its_own(store: Store) -> None:
    job = (await put(store)).job
    first = await ops.lease(store, job.job_id, attempt=1, worker_id="j:attempt:1/1", lease_ms=LEASE)
    retry = await ops.lease(store, job.job_id, attempt=1, worker_id="j:attempt:1/1", lease_ms=LEASE)
    assert first.ok and retry.ok and retry.already
    other = await ops.lease(store, job.job_id, attempt=1, worker_id="j:attempt:1/2", lease_ms=LEASE)
    assert other.status == "stale_attempt"
    assert (await types(store, job.job_id)).count("job.leased") == 1


async def test_an_older_delivery_cannot_take_the_lease_back(store: Store) -> None:
    job_id = await leased(store, worker="j:attempt:1/2")
    stale = await ops.heartbeat(
        store, job_id, worker_id="j:attempt:1/1", attempt=1, lease_ms=LEASE, start_fence=True
    )
    assert stale.status == "lease_lost"
    newer = await ops.heartbeat(
        store,
        job_id,
        worker_id="j:attempt:1/3",
        attempt=1,
        lease_ms=LEASE,
        start_fence=True,
        process={"host": "h", "pid": 7, "role": "worker-codex"},
    )
    assert newer.ok and newer.job is not None and newer.job.lease is not None
    assert newer.job.lease.worker_id == "j:attempt:1/3"
    assert newer.job.lease.process == {"host": "h", "pid": 7, "role": "worker-codex"}


async def test_start_attempt_leases_and_beats_in_one_append(store: Store) -> None:
    job = (await put(store)).job
    out = await ops.start_attempt(
        store, job.job_id, attempt=1, worker_id="j:attempt:1/1", lease_ms=LEASE, process={"p": 1}
    )
    assert out.ok and not out.already
    assert out.job is not None and out.job.status == "running" and out.job.attempt == 1
    assert [r.type for r in out.receipts] == ["job.leased", "job.heartbeat"]
    leased, beat = out.receipts
    assert leased.recorded_at == beat.recorded_at
    assert leased.data["expiresAt"] == beat.data["expiresAt"]
    assert leased.data["process"] == {"p": 1}
    assert await types(store, job.job_id) == ["job.enqueued", "job.leased", "job.heartbeat"]
    # A retry of an ambiguous commit finds the attempt its own and writes nothing.
    again = await ops.start_attempt(
        store, job.job_id, attempt=1, worker_id="j:attempt:1/1", lease_ms=LEASE
    )
    assert again.ok and again.already
    assert len(await types(store, job.job_id)) == 3


async def test_start_attempt_on_a_redelivery_takes_the_lease_with_a_start_fence(
    store: Store,
) -> None:
    job_id = await leased(store, worker="j:attempt:1/1")
    out = await ops.start_attempt(
        store, job_id, attempt=1, worker_id="j:attempt:1/2", lease_ms=LEASE, process={"p": 2}
    )
    assert out.ok and out.job is not None and out.job.lease is not None
    assert out.job.lease.worker_id == "j:attempt:1/2" and out.job.status == "running"
    assert [r.type for r in out.receipts] == ["job.heartbeat"]
    assert out.receipts[0].data["startFence"] is True
    old = await ops.heartbeat(store, job_id, worker_id="j:attempt:1/1", attempt=1, lease_ms=LEASE)
    assert old.status == "lease_lost"
    # An older delivery cannot take it back, and another attempt is stale.
    back = await ops.start_attempt(
        store, job_id, attempt=1, worker_id="j:attempt:1/1", lease_ms=LEASE
    )
    assert back.status == "lease_lost"
    other = await ops.start_attempt(
        store, job_id, attempt=2, worker_id="j:attempt:2/1", lease_ms=LEASE
    )
    assert other.status == "stale_attempt"


async def test_start_attempt_refusals_write_nothing(store: Store) -> None:
    assert (
        await ops.start_attempt(store, "nope", attempt=1, worker_id="w", lease_ms=LEASE)
    ).status == "not_found"
    job = (await put(store)).job
    for attempt, status in ((0, "stale_attempt"), (2, "not_queued")):
        out = await ops.start_attempt(
            store, job.job_id, attempt=attempt, worker_id="w", lease_ms=LEASE
        )
        assert out.status == status
    assert await types(store, job.job_id) == ["job.enqueued"]
    done = await ops.start_attempt(store, job.job_id, attempt=1, worker_id="w", lease_ms=LEASE)
    assert done.ok
    assert (await ops.complete(store, job.job_id, worker_id="w", attempt=1)).ok
    late = await ops.start_attempt(store, job.job_id, attempt=1, worker_id="w2", lease_ms=LEASE)
    assert late.status == "terminal_state"
    assert await types(store, job.job_id) == [
        "job.enqueued",
        "job.leased",
        "job.heartbeat",
        "job.completed",
    ]


async def test_racing_starts_of_one_attempt_leave_one_holder(store: Store) -> None:
    job = (await put(store)).job
    outs = await asyncio.gather(
        *(
            ops.start_attempt(
                store, job.job_id, attempt=1, worker_id=f"j:attempt:1/{k}", lease_ms=LEASE
            )
            for k in range(1, 6)
        )
    )
    assert any(o.ok for o in outs)
    final = await store.get_job(job.job_id)
    assert final is not None and final.lease is not None and final.status == "running"
    # Whoever holds the lease now was told it succeeded; everyone else's writes are refused.
    holder = final.lease.worker_id
    assert any(o.ok and o.job and o.job.lease and o.job.lease.worker_id == holder for o in outs)
    for k in range(1, 6):
        worker = f"j:attempt:1/{k}"
        beat = await ops.heartbeat(store, job.job_id, worker_id=worker, attempt=1, lease_ms=LEASE)
        assert beat.ok == (worker == holder)
    leases = [t for t in await types(store, job.job_id) if t == "job.leased"]
    assert leases == ["job.leased"]


async def test_a_retried_start_after_its_lease_expired_is_lease_lost(store: Store) -> None:
    job = (await put(store)).job
    worker = "j:attempt:1/1"
    first = await ops.start_attempt(store, job.job_id, attempt=1, worker_id=worker, lease_ms=50)
    assert first.ok
    await asyncio.sleep(0.3)  # past the lease by the database clock
    again = await ops.start_attempt(store, job.job_id, attempt=1, worker_id=worker, lease_ms=50)
    assert again.status == "lease_lost" and not again.ok
    assert await types(store, job.job_id) == ["job.enqueued", "job.leased", "job.heartbeat"]
