"""Fair dispatch across organizations (RECEIPT_ORG_MAX_RUNNING_PER_GROUP): real PostgreSQL,
real Temporal, real workers.

One organization's backlog may not hold every slot of a worker queue: it holds at most
RECEIPT_ORG_MAX_RUNNING_PER_GROUP dispatch slots there, another organization's job starts beside
it, and every job held back runs later, exactly once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from typing import Any

import psycopg
import pytest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities.handlers.context import HandlerContext
from receipts import deliveries, fairness, metrics
from receipts import operations as ops
from receipts.store import Store
from roles.delivery.loops import QueuedRedrive
from roles.delivery.starter import HELD_BACK, DriverStarter
from roles.infra.settings import LoopSettings
from tests.integration.delivery.conftest import Stack, running_stack, wait_for_status
from tests.integration.helpers import put

CAP = 2
SLOTS = 3  # the codex worker's attempts at once: more than one organization's cap
BACKLOG = 8
NOW = LoopSettings(redrive_min_age_ms=0, redrive_cooldown_ms=0)


class LongJobs:
    """A codex handler whose jobs run until released, recording who ran, when, and how many of
    each organization ran at once."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.running: collections.Counter[str] = collections.Counter()
        self.most: collections.Counter[str] = collections.Counter()
        self.runs: collections.Counter[str] = collections.Counter()
        self.started: dict[str, asyncio.Event] = collections.defaultdict(asyncio.Event)

    async def __call__(self, ctx: HandlerContext) -> dict[str, Any]:
        org = ctx.job.organization_id or ""
        self.runs[ctx.job.job_id] += 1
        self.running[org] += 1
        self.most[org] = max(self.most[org], self.running[org])
        self.started[ctx.job.job_id].set()
        try:
            await self.release.wait()
            await asyncio.sleep(0.05)  # each finishing job still takes a moment
        finally:
            self.running[org] -= 1
        return {"ok": True}


def starter_only(
    client: Client, store: Store, db_url: str, caps: str
) -> contextlib.AbstractAsyncContextManager[Stack]:
    """A stack with no worker and no dispatcher: the test calls the starter and the redrive."""
    return running_stack(
        client,
        store,
        db_url,
        queues=(),
        dispatcher=False,
        RECEIPT_ORG_MAX_RUNNING_PER_GROUP=caps,
    )


async def active_of(store: Store, job_ids: list[str]) -> int:
    """How many of `job_ids` hold a lease (leased or running) right now."""
    jobs = await asyncio.gather(*(store.get_job(i) for i in job_ids))
    return sum(1 for j in jobs if j is not None and j.status in ("leased", "running"))


async def test_a_later_organization_starts_beside_a_backlog_that_holds_at_most_its_cap(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    handler = LongJobs()
    async with running_stack(
        client,
        fresh_store,
        fresh_db,
        queues=(),
        handlers={"codex": handler},
        RECEIPT_ORG_MAX_RUNNING_PER_GROUP=f"codex={CAP}",
    ) as stack:
        await stack.start_worker("receipt-codex", concurrency=SLOTS)
        backlog = [(await put(fresh_store, org="org-a")).job.job_id for _ in range(BACKLOG)]
        deadline = asyncio.get_running_loop().time() + 20
        while handler.running["org-a"] < CAP:
            assert asyncio.get_running_loop().time() < deadline, "org-a never started its cap"
            await asyncio.sleep(0.05)
        # Give a greedy dispatcher every chance to hand org-a the third slot.
        await asyncio.sleep(1.5)
        assert handler.running["org-a"] == CAP
        assert await active_of(fresh_store, backlog) == CAP

        late = (await put(fresh_store, org="org-b")).job
        await asyncio.wait_for(handler.started[late.job_id].wait(), 15)
        # org-b started while org-a's backlog had not drained: it was held back, not ahead.
        queued = [j for j in await asyncio.gather(*map(fresh_store.get_job, backlog)) if j]
        assert sum(1 for j in queued if j.status == "queued") == BACKLOG - CAP
        assert await fairness.held_back(fresh_store, stack.settings) == BACKLOG - CAP

        # No redrive runs in this stack and the rescan waits a minute: the dispatcher starts
        # each held job when a job of org-a settles and gives its slot back.
        handler.release.set()
        done = [await wait_for_status(fresh_store, i, timeout=45) for i in backlog]
        await wait_for_status(fresh_store, late.job_id)
    assert [j.status for j in done] == ["completed"] * BACKLOG
    assert [j.attempt for j in done] == [1] * BACKLOG
    assert all(handler.runs[i] == 1 for i in backlog)  # each held-back job ran exactly once
    assert handler.most["org-a"] == CAP
    assert await fairness.held_back(fresh_store, stack.settings) == 0


async def test_a_held_back_job_is_started_by_the_redrive_once_a_slot_is_given_back(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    async with starter_only(client, fresh_store, fresh_db, f"codex={CAP}") as stack:
        jobs = [(await put(fresh_store, org="org-a")).job.job_id for _ in range(CAP + 2)]
        other = (await put(fresh_store, org="org-b")).job.job_id
        results = [await stack.starter.start(i) for i in [*jobs, other]]
        assert [r.created for r in results] == [True] * CAP + [False, False, True]
        assert {r.reason for r in results[CAP:-1]} == {HELD_BACK}
        # A held-back job has no delivery: nothing runs it until a slot is free.
        redrive = QueuedRedrive(fresh_store, stack.starter, stack.settings, NOW)
        assert (await redrive.run_once()).redriven == 0

        # One of org-a's jobs settles (its worker never came): its slot is given back.
        first = jobs[0]
        await ops.add_command(fresh_store, first, type="abort", organization_id="org-a")
        assert (await wait_for_status(fresh_store, first, ("canceled",))).status == "canceled"
        passes = await asyncio.gather(
            *(
                QueuedRedrive(fresh_store, stack.starter, stack.settings, NOW).run_once()
                for _ in "ab"
            )
        )
        assert sum(p.redriven for p in passes) == 1
        started = [i for i in jobs[CAP:] if (await deliveries.job_and_latest(fresh_store, i))[1]]
        assert started == [jobs[CAP]]  # the oldest waiting job, once


async def test_concurrent_starts_never_take_more_than_the_cap(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    async with starter_only(client, fresh_store, fresh_db, f"codex={CAP}") as stack:
        jobs = [(await put(fresh_store, org="org-a")).job.job_id for _ in range(12)]
        results = await asyncio.gather(*(stack.starter.start(i) for i in jobs))
    assert sum(r.created for r in results) == CAP
    assert sum(r.reason == HELD_BACK for r in results) == len(jobs) - CAP


async def test_held_back_starts_are_logged_once_in_a_while_per_organization_and_queue(
    client: Client, fresh_store: Store, fresh_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Each held start was an INFO line of its own: a backlog past the cap wrote one per job
    # (10 here) beyond the two a job writes, and again at each start tried (the log-events
    # audit). Counted each time in receipt_jobs_held_back_total.
    caplog.set_level(logging.INFO, logger="roles.delivery.starter")
    async with starter_only(client, fresh_store, fresh_db, f"codex={CAP}") as stack:
        jobs = [(await put(fresh_store, org="org-a")).job.job_id for _ in range(CAP + 10)]
        results = [await stack.starter.start(i) for i in jobs]
        other = [(await put(fresh_store, org="org-b")).job.job_id for _ in range(CAP + 1)]
        results += [await stack.starter.start(i) for i in other]
    assert sum(r.reason == HELD_BACK for r in results) == 11
    held = [r for r in caplog.records if getattr(r, "event", None) == "delivery.held_back"]
    logged = [(vars(r)["organizationId"], vars(r).get("unloggedSince")) for r in held]
    assert logged == [("org-a", 0), ("org-b", 0)]  # one line each, 11 starts held


async def test_with_the_cap_off_every_job_is_started(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    async with starter_only(client, fresh_store, fresh_db, "0") as stack:
        jobs = [(await put(fresh_store, org="org-a")).job.job_id for _ in range(5)]
        results = [await stack.starter.start(i) for i in jobs]
        assert not fairness.capped(stack.settings)
    assert all(r.created for r in results)


async def test_a_delayed_job_waits_without_a_driver_and_is_dispatched_when_due(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    handler = LongJobs()
    handler.release.set()
    async with running_stack(
        client, fresh_store, fresh_db, queues=("receipt-codex",), handlers={"codex": handler}
    ) as stack:
        job = (await put(fresh_store, org="org-a", delayMs=1_500)).job
        assert (await stack.starter.start(job.job_id)).reason == "not_available"
        done = await wait_for_status(fresh_store, job.job_id, timeout=20)
    assert done.status == "completed" and handler.runs[job.job_id] == 1
    assert done.lease is None and job.available_at is not None
    receipts = await fresh_store.read_stream(f"jobs/{job.job_id}")
    leased = next(r for r in receipts if r.type == "job.leased")
    assert leased.recorded_at >= job.available_at


class RefusingStarter(DriverStarter):
    """A starter whose Temporal refuses one job's start (as it refused a search attribute over
    its size limit): the fault is injected at the one call, everything else is real."""

    def __init__(self, starter: DriverStarter, refused: str) -> None:
        super().__init__(starter.client, starter.store, starter.settings, starter.timing)
        self.refused = refused

    async def _start_driver(self, job: Any, *args: Any) -> tuple[str, bool]:
        if job.job_id == self.refused:
            raise RPCError(
                "search attribute value size exceeds limit", RPCStatusCode.INVALID_ARGUMENT, b""
            )
        return await super()._start_driver(job, *args)


async def test_a_job_temporal_refuses_neither_stops_the_redrive_nor_keeps_a_slot(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    """One job whose start Temporal refuses ended every redrive pass before the jobs after it
    (and the callbacks owed), and kept the organization's dispatch slot it took for the start."""
    async with starter_only(client, fresh_store, fresh_db, "codex=3") as stack:
        refused = (await put(fresh_store, org="org-a")).job.job_id
        others = [(await put(fresh_store, org="org-a")).job.job_id for _ in range(2)]
        failures = metrics.value("receipt_redrive_failures_total")
        refusing = RefusingStarter(stack.starter, refused)
        result = await QueuedRedrive(fresh_store, refusing, stack.settings, NOW).run_once()
        assert (result.failed, result.redriven) == (1, 2)  # the jobs after it were started
        assert metrics.value("receipt_redrive_failures_total") == failures + 1
        async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
            cur = await conn.execute("SELECT job_id FROM dispatch_slots")
            holders = {row[0] for row in await cur.fetchall()}
        assert holders == set(others)  # the refused job's slot was given back
        # Temporal takes it now: the next pass starts it in the slot it gave back.
        again = await QueuedRedrive(fresh_store, stack.starter, stack.settings, NOW).run_once()
        assert (again.failed, again.redriven) == (0, 1)
        latest = (await deliveries.job_and_latest(fresh_store, refused))[1]
        assert latest is not None and latest.generation == 0
