"""Fair dispatch across organizations: dispatch slots (docs/design.md §6).

One organization may hold at most `RECEIPT_ORG_MAX_RUNNING_PER_GROUP` dispatch slots per worker
queue. The driver starter takes a slot when it starts an organization's job (`claim`), the
transaction that settles the job gives it back (`append_job` in receipts/sql/queries.sql), and
the dispatcher then starts the jobs the freed slot lets through (`freed`). Whether a job is held
back is `receipts/plan.py` `next_step` with `Slots`; the scans apply the same rule in SQL
(`dispatch_queue`, migrations/0008_fair_dispatch.sql). Like the rest of delivery bookkeeping a
slot is not ownership state: losing one loses no job, the redrive starts it again.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from receipts.jobs import Job
from receipts.kinds import WORKER_QUEUES, route
from receipts.plan import NextStep, Slots, next_step
from receipts.settings import Settings
from receipts.store import Store


def caps(settings: Settings) -> dict[str, Any]:
    """The per-queue caps as statement parameters (`queues`, `caps`: the scans' arrays), and
    `most`, the largest cap: the most jobs one given-back slot's refill may name."""
    queues = list(WORKER_QUEUES)
    per_queue = [settings.org_running_cap(q) for q in queues]
    return {"queues": queues, "caps": per_queue, "most": max(per_queue, default=0)}


def capped(settings: Settings) -> bool:
    """True when some worker queue caps an organization's slots."""
    return any(settings.org_running_cap(q) for q in WORKER_QUEUES)


def share_of(job: Job, settings: Settings) -> tuple[str, int] | None:
    """The job's worker queue and its organization's cap there; None when the job is not
    shared out (no organization, or no cap on its queue)."""
    queue = route(job.agent_id, job.kind)
    cap = settings.org_running_cap(queue)
    if job.organization_id is None or cap <= 0:
        return None
    return queue, cap


async def claim(store: Store, job: Job, now: datetime, queue: str, cap: int) -> NextStep:
    """The plan for starting a delivery of `job` (an organization's job on `queue`, capped at
    `cap`), at the database clock `now`: `HELD` when its organization's other active jobs hold
    every slot there; a job planned `DELIVER` takes a slot, kept until the job settles. A job
    that holds a slot already (its delivery is being started again) keeps it.

    One statement (`dispatch_claim`, migrations/0010) under a transaction-scoped lock of
    (organization, queue), so two starters never both take the last slot.
    """
    assert job.organization_id is not None
    params = {
        "job_id": job.job_id,
        "organization_id": job.organization_id,
        "worker_queue": queue,
        "cap": cap,
    }
    row = await store.fetch_one("dispatch_claim", params)
    assert row is not None
    held, mine, took = int(row[0]), bool(row[1]), bool(row[2])
    # The statement took a slot by the plan's own rule (`Slots.full`); a job left without one
    # sees its organization's share as full, so it is held, never started without a slot.
    return next_step(job, now, slots=None if mine or took else Slots(max(held, cap), cap))


async def release(store: Store, job_id: str) -> bool:
    """Give back the slot a queued job took for a start that failed (`dispatch_release`);
    whether it held one."""
    return bool(await store.fetch("dispatch_release", {"job_id": job_id}))


async def freed(store: Store, settled_job_id: str, settings: Settings) -> list[str]:
    """The jobs a slot given back by `settled_job_id` lets start: its organization's oldest
    waiting jobs on its queue, as many as it has slots free there (none without a cap)."""
    rows = await store.fetch("dispatch_freed", {"job_id": settled_job_id, **caps(settings)})
    return [row[0] for row in rows]


async def held_back(store: Store, settings: Settings) -> int:
    """How many queued, deliverable jobs wait for a slot of their organization now."""
    row = await store.fetch_one("dispatch_held_back", caps(settings))
    return int(row[0]) if row else 0
