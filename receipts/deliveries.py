"""Delivery bookkeeping in PostgreSQL: generations, redrive keys, callback claims and the ledger.

None of this is ownership state: losing it loses no job (docs/design.md §6). Ledger writes are
best-effort — a failure is logged and counted, never raised into a receipt append.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from psycopg.types.json import Jsonb

from receipts.bookkeeping import writer
from receipts.jobs import Job
from receipts.kinds import CONTRACTS
from receipts.store import Store, translate_errors
from receipts.streams import dumps

log = logging.getLogger("receipts.deliveries")

MAX_GENERATION = 32
"""Deliveries per job: generations 0..31; starting the 33rd fails the job."""


def driver_workflow_id(job_id: str, generation: int) -> str:
    """Return the driver's workflow id: `<jobId>` for generation 0, then `<jobId>:gen:<g>`."""
    return job_id if generation == 0 else f"{job_id}:gen:{generation}"


def attempt_workflow_id(job_id: str, attempt: int) -> str:
    """Return the attempt workflow's id: `<jobId>:attempt:<n>`."""
    return f"{job_id}:attempt:{attempt}"


def generation_exhausted_message(job_id: str) -> str:
    """The error a job fails with when its delivery ran out of generations (docs/design.md §11)."""
    return f"delivery recovery exceeded {MAX_GENERATION} generations for {job_id}"


def redrive_key(job_id: str, observed_seq: int, attempt: int) -> str:
    """Return the redrive dispatch key `<jobId>:redrive:<observedSeq>:<attempt>`."""
    return f"{job_id}:redrive:{observed_seq}:{attempt}"


@dataclass(frozen=True, slots=True)
class LatestDelivery:
    """The newest generation started for a job."""

    generation: int
    workflow_id: str


async def _fetch(store: Store, name: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    with translate_errors():
        return await store.fetch(name, params)


async def job_and_latest(
    store: Store, job_id: str
) -> tuple[Job | None, LatestDelivery | None, datetime]:
    """The job's folded state, its latest delivery generation and the database clock, in one
    round trip."""
    rows = await _fetch(store, "delivery_job_and_latest", {"job_id": job_id})
    state, generation, workflow_id, now = rows[0]
    job = Job.model_validate(state) if state is not None else None
    latest = LatestDelivery(generation, workflow_id) if generation is not None else None
    return job, latest, now


async def record(store: Store, job_id: str, generation: int) -> None:
    """Record that generation `generation` of the job's delivery was started, with the
    bookkeeping rows queued before it in the same round trip (receipts/bookkeeping.py). A record
    that cannot be written is counted and dropped: the starter steps past a closed but
    unrecorded generation."""
    await writer(store).write_now(
        "delivery_record",
        {
            "job_id": job_id,
            "generation": generation,
            "workflow_id": driver_workflow_id(job_id, generation),
        },
    )


async def claim_redrive(
    store: Store, job_id: str, observed_seq: int, attempt: int, *, cooldown_ms: int
) -> Literal["first", "again"] | None:
    """Claim one observed queue state for redrive: "first", or "again" for a state claimed
    before whose delivery was lost (its claim older than `cooldown_ms`); None when another
    pass claimed it within the cooldown."""
    key = redrive_key(job_id, observed_seq, attempt)
    params = {"redrive_key": key, "job_id": job_id, "cooldown_ms": cooldown_ms}
    rows = await _fetch(store, "redrive_claim", params)
    if not rows:
        return None
    return "again" if rows[0][0] else "first"


async def release_redrive(store: Store, job_id: str, observed_seq: int, attempt: int) -> None:
    """Give back a redrive claim whose pass delivered nothing."""
    key = redrive_key(job_id, observed_seq, attempt)
    await _fetch(store, "redrive_release", {"redrive_key": key})


async def touch(store: Store, job_id: str) -> None:
    """Restart the job's redrive cooldown (a pass found its delivery still open)."""
    await _fetch(store, "delivery_touch", {"job_id": job_id})


NO_CAPS: Mapping[str, Any] = {"queues": [], "caps": []}
"""The scans' parameters when no organization's share of a queue is capped."""


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a scan's next page of the queued jobs starts: after the job created at
    `created_at` with id `job_id` (queued jobs in that order: creation, then id); `START`: from
    the oldest."""

    created_at: datetime | None = None
    job_id: str | None = None


START = Cursor()


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a scan of the queued jobs: the jobs it picked (`job_ids`, with their `seqs`
    and `attempts` for the redrive), how many it read, and where the next page starts (`START`
    once this one read the newest)."""

    job_ids: list[str]
    read: int
    next: Cursor
    seqs: list[int] = field(default_factory=list)
    attempts: list[int] = field(default_factory=list)

    @property
    def last(self) -> bool:
        """True when this page read the newest queued job: the next starts from the oldest."""
        return self.next == START


async def _page(store: Store, name: str, params: dict[str, Any]) -> Page:
    [(read, created_at, job_id, job_ids, seqs, attempts)] = await _fetch(store, name, params)
    return Page(list(job_ids), read, Cursor(created_at, job_id), seqs or [], attempts or [])


def _after(cursor: Cursor) -> dict[str, Any]:
    return {"after_created_at": cursor.created_at, "after_job_id": cursor.job_id}


async def undelivered_queued(
    store: Store,
    limit: int = 500,
    caps: Mapping[str, Any] = NO_CAPS,
    *,
    after: Cursor = START,
    page: int | None = None,
) -> Page:
    """One page of the rescan: of the `page` (default `limit`) queued jobs after `after`, the
    deliverable ones never dispatched and not held back by the per-queue `caps`
    (receipts/fairness.py `caps`), at most `limit`: each organization's oldest first,
    interleaved. A pass reads one page, whatever the length of the queue; following `next`,
    pass after pass, reaches every queued job."""
    params = {"limit": limit, "page": page or limit, **_after(after), **caps}
    return await _page(store, "undelivered_queued", params)


async def next_available_at(store: Store) -> datetime | None:
    """Return the soonest `availableAt` of an undelivered queued job still in the future."""
    rows = await _fetch(store, "next_available_at", {})
    return rows[0][0] if rows else None


async def redrive_candidates(
    store: Store,
    *,
    min_age_ms: int,
    cooldown_ms: int,
    limit: int = 200,
    caps: Mapping[str, Any] = NO_CAPS,
    after: Cursor = START,
    page: int | None = None,
) -> Page:
    """One page of the redrive: of the `page` (default `limit`) queued jobs after `after`,
    those due for a redrive and not held back by `caps`, at most `limit`, organizations
    interleaved (`seqs` and `attempts` beside `job_ids`)."""
    params = {
        "min_age_ms": min_age_ms,
        "cooldown_ms": cooldown_ms,
        "limit": limit,
        "page": page or limit,
        **_after(after),
        **caps,
    }
    return await _page(store, "redrive_candidates", params)


async def claim_callback(
    store: Store, job_id: str, event: str, url: str, *, take_over: bool = False
) -> bool:
    """Claim the one post of `event` for `job_id` to `url`; False when already claimed (and
    not yet posted: `take_over` takes a claim younger than its 30 s window too), or when the
    order of `dispatched` and the terminal event to `url` forbids it now (the SQL says how).
    Claims of one job and URL take turns, so each sees what the other claimed."""
    params = {"job_id": job_id, "event": event, "url": url, "take_over": take_over}
    async with store.transaction() as tx:
        await tx.lock_key(f"callback:{job_id}:{url}")
        return bool(await tx.fetch("callback_claim", params))


async def release_callback(store: Store, job_id: str, event: str, url: str) -> None:
    """Give back a claim whose post was cut off before its result: claimable again at once."""
    await _fetch(store, "callback_release", {"job_id": job_id, "event": event, "url": url})


async def callback_result(
    store: Store, job_id: str, event: str, url: str, status: str, error: str | None
) -> None:
    """Record the outcome of a callback post."""
    await _fetch(
        store,
        "callback_result",
        {"job_id": job_id, "event": event, "url": url, "status": status, "last_error": error},
    )


# How long a settled job's owed terminal callback waits for the `dispatched` post its driver
# makes beside the attempt: past the callback activity's 60 s start-to-close and its retry (a
# driver killed mid-post), after which only a driver gone for good still owes it.
DISPATCHED_WAIT_S = 90


async def owed_callbacks(
    store: Store, urls: Sequence[str], *, limit: int = 200
) -> tuple[list[tuple[str, str]], bool]:
    """Up to `limit` `(jobId, event)` of settled jobs whose terminal callbacks are still owed,
    due first, and whether more may be due. It reads at most five times `limit` due rows: a
    job whose `dispatched` to one of `urls` is still owed waits (`DISPATCHED_WAIT_S`), looked at
    again 5 s later (so the call writes)."""
    scan = 5 * limit
    params = {
        "limit": limit,
        "scan": scan,
        "urls": list(urls),
        "dispatched_wait_s": DISPATCHED_WAIT_S,
    }
    [(scanned, job_ids, events)] = await _fetch(store, "callbacks_owed", params)
    return list(zip(job_ids, events, strict=True)), len(job_ids) >= limit or scanned >= scan


async def settle_owed_callback(store: Store, job_id: str, urls: list[str]) -> bool:
    """Empty the job's outbox row when every URL in `urls` has its terminal post (posted or
    given up); otherwise look at it again after the claim window. True when emptied."""
    if await _fetch(store, "callback_owed_done", {"job_id": job_id, "urls": urls}):
        return True
    await _fetch(store, "callback_owed_later", {"job_id": job_id})
    return False


async def drop_owed_callbacks(store: Store) -> None:
    """No callback URL is configured: nothing settled so far is owed."""
    await _fetch(store, "callbacks_owed_drop", {})


def _ledger(store: Store, name: str, params: dict[str, Any]) -> None:
    params["detail"] = Jsonb(params.get("detail"), dumps=dumps)
    writer(store).submit(name, params)


def ledger_workflow(
    store: Store,
    *,
    workflow_id: str,
    run_id: str,
    job_id: str | None,
    kind: str,
    temporal_type: str,
    task_queue: str,
    status: str,
    detail: Any = None,
) -> None:
    """Best-effort, queued to the bookkeeping writer: record a delivery run of a job whose kind
    declares a durable workflow (its contract's `workflow`), under that workflow's name; the
    kinds without one are not in the workflow ledger (their runs are Temporal's history and
    their receipts)."""
    contract = CONTRACTS.get(kind)
    if contract is None or contract.workflow is None:
        return
    _ledger(
        store,
        "ledger_workflow",
        {
            "workflow_id": workflow_id,
            "run_id": run_id,
            "job_id": job_id,
            "workflow": contract.workflow,
            "task_queue": task_queue,
            "status": status,
            "detail": {"temporalType": temporal_type, **(detail or {})},
        },
    )


def ledger_activity(
    store: Store,
    *,
    workflow_id: str,
    activity_id: str,
    attempt: int,
    job_id: str | None,
    kind: str,
    activity: str,
    worker_id: str | None,
    status: str,
    detail: Any = None,
) -> None:
    """Best-effort, queued to the bookkeeping writer: record an attempt of a job whose kind
    declares a durable activity (its contract's `has_durable_activity`) in the activity ledger;
    the others' are not."""
    contract = CONTRACTS.get(kind)
    if contract is None or not contract.has_durable_activity:
        return
    _ledger(
        store,
        "ledger_activity",
        {
            "workflow_id": workflow_id,
            "activity_id": activity_id,
            "attempt": attempt,
            "job_id": job_id,
            "activity": activity,
            "worker_id": worker_id,
            "status": status,
            "detail": detail,
        },
    )
