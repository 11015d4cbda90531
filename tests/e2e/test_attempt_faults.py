"""An attempt is an activity of its driver: worker and driver faults with real role processes.

A SIGKILLed worker is found by Temporal's heartbeat timeout (`RECEIPT_WORKER_LOST_TIMEOUT_MS`,
30 s by default) even at the spec's default leases, and the redelivered activity takes the
lease over through the start-fence; a stopped delivery woken after its redelivery settled
writes nothing; a SIGKILLed driver does not stop the attempt, and once back posts the
terminal callback once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import Callable
from typing import Any

import pytest

from receipts.jobs import TERMINAL_STATUSES
from receipts.messages import CallbackRequest
from receipts.store import Store
from tests.e2e.conftest import task
from tests.e2e.roles_harness import RoleProcesses, holder_id, wait_for
from tests.eventually import eventually
from tests.integration.delivery.receiver import Receiver
from tests.integration.helpers import put

pytestmark = pytest.mark.e2e

TERMINAL = tuple(TERMINAL_STATUSES)
SETTLE_TYPES = ("job.completed", "job.failed", "job.canceled")
WORKER_LOST_S = 30.0  # the default RECEIPT_WORKER_LOST_TIMEOUT_MS
# Generous on a loaded 2-core machine, and still far below the two receipt cadences (400 s at
# the default codex lease) that bounded it before.
REDELIVERY_WAIT_S = WORKER_LOST_S + 60


async def holder_pid(store: Store, job_id: str) -> int:
    job = await wait_for(store, job_id, ("running",), 60)
    assert job.lease is not None and job.lease.process is not None
    return int(job.lease.process["pid"])


async def wait_for_receipt(
    store: Store, job_id: str, found: Callable[[Any], bool], timeout: float
) -> Any:
    receipts = await eventually(
        lambda: store.read_stream(f"jobs/{job_id}"),
        lambda receipts: any(found(r) for r in receipts),
        timeout=timeout,
        every=0.2,
        what=f"such a receipt on {job_id}",
    )
    return next(r for r in receipts if found(r))


# What a woken delivery logs when its fence refuses it: its heartbeat (the lease is lost) or
# its settlement.
WOKEN_EVENTS = {"attempt.lease_lost", "attempt.settled"}


def start_fence(receipt: Any) -> bool:
    return receipt.type == "job.heartbeat" and bool(receipt.data.get("startFence"))


async def test_a_sigkilled_worker_is_redelivered_within_the_worker_lost_timeout_at_default_leases(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses]
) -> None:
    store, _ = e2e_store
    procs = roles()  # the spec's default leases: codex 900 s, a receipt cadence of 200 s
    procs.start("driver")
    procs.start("worker-codex-1", "worker-codex")
    procs.start("worker-codex-2", "worker-codex")
    try:
        # One attempt only: it can complete only through Temporal's redelivery of attempt 1.
        job = (await put(store, maxAttempts=1, payload_extra=task("sleep", "6"))).job
        victim = procs.name_of(await holder_pid(store, job.job_id))
        assert victim is not None
        killed_at = await store.now()
        procs.kill(victim)
        takeover = await wait_for_receipt(store, job.job_id, start_fence, REDELIVERY_WAIT_S)
        done = await wait_for(store, job.job_id, TERMINAL, 60)
    except BaseException:
        print(procs.logs())
        raise
    redelivered_s = (takeover.recorded_at - killed_at).total_seconds()
    print(f"worker SIGKILL → redelivered attempt took the lease over in {redelivered_s:.1f} s")
    assert redelivered_s <= REDELIVERY_WAIT_S
    redelivery = takeover.data["workerId"]  # delivery 2 of attempt 1 (delivery_ids.delivery_id)
    assert redelivery.startswith(f"{job.job_id}:attempt:1.") and redelivery.endswith("/2")
    assert (done.status, done.attempt) == ("completed", 1)
    kinds = [r.type for r in await store.read_stream(f"jobs/{job.job_id}")]
    assert kinds.count("job.leased") == 1 and "job.lease_expired" not in kinds
    assert sum(k in SETTLE_TYPES for k in kinds) == 1
    receipts = await store.read_stream(f"jobs/{job.job_id}")
    assert receipts[-1].data["workerId"] == redelivery
    # The surviving worker says what happened (log event; `receipt_attempt_redeliveries`).
    survivor = "worker-codex-2" if victim == "worker-codex-1" else "worker-codex-1"
    log = (procs.log_dir / f"{survivor}.0.log").read_text()
    assert any('"attempt.redelivered"' in line and redelivery in line for line in log.splitlines())


async def test_a_stopped_delivery_woken_after_its_redelivery_settled_writes_nothing(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses]
) -> None:
    store, _ = e2e_store
    # Lease 10 s: Temporal redelivers after two cadences (6.7 s) without a heartbeat. Three
    # deliveries: the stopped process's own open polls may swallow one.
    procs = roles(
        CODEX_JOB_LEASE_MS="10000", JOB_LEASE_MS="10000", RECEIPT_DELIVERIES_PER_ATTEMPT="3"
    )
    procs.start("driver")
    procs.start("worker-codex-1", "worker-codex")
    procs.start("worker-codex-2", "worker-codex")
    try:
        job = (await put(store, payload_extra=task("sleep", "4"))).job
        stopped = procs.name_of(await holder_pid(store, job.job_id))
        assert stopped is not None
        stopped_id = await holder_id(store, job.job_id)  # delivery 1 of attempt 1
        procs.signal(stopped, signal.SIGSTOP)
        done = await wait_for(store, job.job_id, TERMINAL, 120)
        settled = await store.read_stream(f"jobs/{job.job_id}")
        procs.signal(stopped, signal.SIGCONT)
        # Woken: its handler's command has long finished, its heartbeat is due, and Temporal
        # has timed it out; whatever it tries, the fence (or the re-read) refuses it. Its log
        # says when it tried (at most 8 s: a delivery Temporal cancelled may log neither).
        with contextlib.suppress(AssertionError):
            await eventually(
                lambda: asyncio.to_thread(procs.logged, stopped, WOKEN_EVENTS, workerId=stopped_id),
                timeout=8,
                every=0.2,
            )
        after = await store.read_stream(f"jobs/{job.job_id}")
    except BaseException:
        print(procs.logs())
        raise
    assert done.status == "completed"
    assert after == settled  # nothing written after the redelivery settled
    assert sum(r.type in SETTLE_TYPES for r in after) == 1
    assert after[-1].type == "job.completed" and after[-1].data["workerId"] != stopped_id
    assert procs.processes[stopped].poll() is None  # it lived through it


async def test_a_sigkilled_driver_leaves_the_attempt_running_and_posts_the_callback_once_back(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses], temporal_env: Any
) -> None:
    """The driver posts `dispatched` beside the attempt; killed while that post waits for its
    answer (the receiver holds it 3 s), the attempt runs on and settles. The restarted driver's
    retry of the post takes its claim over and posts it (the activity heartbeats: within
    seconds, not the 60 s start-to-close), then the terminal callback: the receiver never hears
    `completed` before `dispatched`, and hears it once."""
    store, _ = e2e_store
    async with Receiver(hold={"dispatched": 3.0}) as receiver:
        # The recovery loops' own callback pass waits 10 min: the terminal callback is the
        # driver's to post.
        procs = roles(
            RECEIPT_EVENT_CALLBACK_URL=receiver.url,
            RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS="600000",
        )
        procs.start("driver")
        procs.start("worker-codex")
        try:
            await asyncio.sleep(7)  # the roles' first recovery passes (5 s after start) ran
            job = (await put(store, payload_extra=task("sleep", "4"))).job
            await wait_for(store, job.job_id, ("running",), 60)
            procs.kill("driver")
            # The attempt settles the job in PostgreSQL with no driver alive.
            done = await wait_for(store, job.job_id, TERMINAL, 60)
            posted_while_dead = [json.loads(r.body)["event"] for r in receiver.requests]
            procs.start("driver")

            async def heard() -> list[str]:
                return [json.loads(r.body)["event"] for r in receiver.requests]

            await eventually(heard, lambda e: "completed" in e, timeout=60, what="completed")
            await asyncio.sleep(3)  # nothing else arrives
            client = temporal_env.client
            result = await asyncio.wait_for(client.get_workflow_handle(job.job_id).result(), 30)
            history = await client.get_workflow_handle(job.job_id).fetch_history()
        except BaseException:
            print(procs.logs())
            raise
    assert done.status == "completed"
    assert set(posted_while_dead) <= {"dispatched"}  # the killed try's post, answered late
    events = [json.loads(r.body)["event"] for r in receiver.requests]
    assert events[-1] == "completed" and events.count("completed") == 1
    assert set(events[:-1]) == {"dispatched"}  # the retry's post, perhaps the killed try's too
    assert result == "completed"
    # The driver itself posted it: its history (replayed by the restarted driver) ends with the
    # `post_callbacks` activity for `completed`.
    requests = []
    for event in history.events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == "post_callbacks":
                [request] = await client.data_converter.decode(
                    attrs.input.payloads, [CallbackRequest]
                )
                requests.append(request.event)
    assert requests == ["dispatched", "completed"]
