"""A locked read of a job sees every write committed while it waited for the lock. A guarded
plain heartbeat locks the jobs row but writes only its lease row: a read that waited on that
lock and read in its own earlier snapshot saw the job one receipt behind, and an append at that
head failed as a conflict (a singleton steer answered 409 "jobId already in use", a command
refused as a settlement conflict)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from receipts import operations as ops
from receipts.guarded import append_if_unchanged
from receipts.jobs import Job
from receipts.store import Draft, Store
from receipts.tenancy import scoped_id
from tests.integration.helpers import new_id, put


async def _leased(store: Store, **kw: Any) -> Job:
    job = (await put(store, **kw)).job
    out = await ops.start_attempt(store, job.job_id, attempt=1, worker_id="w/1", lease_ms=60_000)
    assert out.ok, out.status
    return out.job


async def _heartbeat_held_open(
    store: Store,
    job_id: str,
    started: asyncio.Event,
    release: asyncio.Event,
    *,
    worker_id: str = "w/1",
    **fields: Any,
) -> None:
    """A worker's guarded heartbeat statement, in flight (row lock held) until `release`; with
    `startFence=True`, another delivery's start-fence takeover."""
    async with store.transaction() as tx:
        job, now = await tx.job_with_now(job_id)
        data = {
            "workerId": worker_id,
            "attempt": 1,
            "expiresAt": (now + timedelta(seconds=60)).isoformat(),
            **fields,
        }
        written = await append_if_unchanged(
            store, job_id, job, [Draft("job.heartbeat", data)], now, lease_held=True, session=tx
        )
        assert written is not None
        started.set()
        await release.wait()


async def test_a_command_racing_an_in_flight_heartbeat_is_appended(store: Store) -> None:
    job = await _leased(store)
    started, release = asyncio.Event(), asyncio.Event()
    hb = asyncio.create_task(_heartbeat_held_open(store, job.job_id, started, release))
    await started.wait()
    cmd = asyncio.create_task(
        ops.add_command(store, job.job_id, type="steer", payload={"x": 1}, check_organization=False)
    )
    await asyncio.sleep(0.3)  # the command's locked read waits on the heartbeat's row lock
    release.set()
    await hb
    out = await cmd
    assert out.ok, out.status


async def test_a_steer_enqueue_racing_an_in_flight_heartbeat_is_absorbed(store: Store) -> None:
    session = new_id("session")
    job = await _leased(store, sessionKey=session)
    started, release = asyncio.Event(), asyncio.Event()
    hb = asyncio.create_task(_heartbeat_held_open(store, job.job_id, started, release))
    await started.wait()
    steer = asyncio.create_task(put(store, sessionKey=session, singletonMode="steer"))
    await asyncio.sleep(0.3)
    release.set()
    await hb
    result = await steer
    assert result.outcome == "steered"


async def test_a_superseded_delivery_hands_nothing_on_once_the_takeover_committed(
    store: Store,
) -> None:
    from activities.fence import AttemptFence
    from activities.handlers.fenced import FencedReceipts, FenceLost

    job = await _leased(store)
    old = FencedReceipts(AttemptFence(store, job.job_id, attempt=1, worker_id="w/1"))
    started, release = asyncio.Event(), asyncio.Event()
    takeover = asyncio.create_task(
        _heartbeat_held_open(store, job.job_id, started, release, worker_id="w/2", startFence=True)
    )
    await started.wait()
    successor = new_id("successor")
    hand_off = asyncio.create_task(old.hand_off(successor, dict(job.payload)))
    await asyncio.sleep(0.3)  # w/1's fence check waits on the takeover's row lock
    release.set()
    await takeover
    holder = (await store.get_job(job.job_id)).lease.worker_id  # type: ignore[union-attr]
    assert holder == "w/2"
    try:
        await hand_off
    except FenceLost:
        pass
    # w/2 holds the fence since before w/1's transaction read it: w/1 must have written nothing.
    assert await store.get_job(successor) is None


async def test_steers_racing_heartbeats_are_never_refused_as_a_taken_job_id(store: Store) -> None:
    """No hand-held lock: a worker heartbeating and callers steering its session, at once."""
    from receipts.errors import ConflictError

    session = new_id("session")
    job = await _leased(store, sessionKey=session)
    refused = 0
    for _ in range(60):
        outcomes = await asyncio.gather(
            *(
                ops.heartbeat(store, job.job_id, worker_id="w/1", attempt=1, lease_ms=60_000)
                for _ in range(3)
            ),
            *(put(store, sessionKey=session, singletonMode="steer") for _ in range(2)),
            return_exceptions=True,
        )
        refused += sum(isinstance(o, ConflictError) for o in outcomes)
    assert refused == 0, (
        f"{refused} steers answered ConflictError (the api's 409 'jobId already in use')"
    )


async def test_a_steer_post_racing_a_heartbeat_is_answered_202_not_409(
    store: Store, db_url: str
) -> None:
    from tests.integration.api_support import AS_A, api_client, enqueue_body

    session = new_id("session")
    async with api_client(db_url, store=store) as client:
        first = await client.post(
            "/agents/codex/jobs", json=enqueue_body(sessionKey=session), headers=AS_A
        )
        assert first.status_code == 202, first.text
        internal = scoped_id("org-a", first.json()["job"]["jobId"])
        assert (
            await ops.start_attempt(store, internal, attempt=1, worker_id="w/1", lease_ms=60_000)
        ).ok
        started, release = asyncio.Event(), asyncio.Event()
        hb = asyncio.create_task(_heartbeat_held_open(store, internal, started, release))
        await started.wait()
        steer = asyncio.create_task(
            client.post(
                "/agents/codex/jobs",
                json=enqueue_body(
                    sessionKey=session, singletonMode="steer", payload_extra={"n": 2}
                ),
                headers=AS_A,
            )
        )
        await asyncio.sleep(0.3)
        release.set()
        await hb
        response = await steer
        assert response.status_code == 202, response.text
