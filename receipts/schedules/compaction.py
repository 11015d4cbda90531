"""Compaction of schedules' streams: a schedule writes a receipt per firing, so a per-minute one
would write half a million a year. Retention (`receipts/retention.py`) deletes a schedule's
firing receipts (`schedule.fired`, `schedule.skipped`) recorded before its cutoff, except the
newest `RECENT_FIRINGS` (the projection's recent firings, which a rebuild folds again) and any
of the last `MIN_AGE` (a firing Temporal delivers late, or the other occurrence of an hour a
DST fall-back repeats, is looked up in the stream), and appends one `schedule.compacted`
receipt with the totals the deleted ones carried. Definitions are never deleted, nor the head:
the fold of what is left is the projection (`assembly.verify`).

One schedule per transaction, under its stream's lock (as a firing takes it), at most
`MAX_ROWS` receipts deleted per schedule and batch: a year's backlog is compacted over passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from receipts.schedules.model import RECENT_FIRINGS, schedule_stream
from receipts.schedules.store import append, load
from receipts.store import Draft, Store, Tx, translate_errors

MIN_AGE = timedelta(days=2)
MAX_ROWS = 10_000
COMPACTED = "schedule.compacted"


@dataclass(frozen=True, slots=True)
class Compacted:
    """What one batch did: schedules compacted, receipts deleted, and the last schedule it
    looked at (the next batch starts after it; None: no schedule left)."""

    schedules: int = 0
    receipts: int = 0
    last: str | None = None


def cutoff_of(cutoff: datetime, now: datetime) -> datetime:
    """Retention's cutoff, but never within `MIN_AGE` of now."""
    return min(cutoff, now - MIN_AGE)


async def candidates(store: Store, cutoff: datetime, batch: int, after: str = "") -> list[str]:
    """Schedules after `after` (in id order) with firing receipts a compaction at `cutoff`
    would delete."""
    with translate_errors():
        rows = await store.fetch(
            "schedule_compaction_candidates",
            {"cutoff": cutoff, "keep": RECENT_FIRINGS, "batch": batch, "after": after},
        )
    return [row[0] for row in rows]


async def compact_in(tx: Tx, schedule_id: str, cutoff: datetime, *, dry_run: bool = False) -> int:
    """Delete the schedule's old firing receipts and its earlier compactions and append one
    `schedule.compacted` with the totals as they stand (the fold sets them); return how many
    receipts went (would go, with `dry_run`)."""
    stream = schedule_stream(schedule_id)
    await tx.lock_streams([stream])
    state = await load(tx, schedule_id)
    if state is None:
        return 0
    params = {"stream": stream, "cutoff": cutoff, "keep": RECENT_FIRINGS, "limit": MAX_ROWS}
    if dry_run:
        row = await tx.fetch_one("schedule_compaction_count", params)
        return int(row[0]) + int(row[1]) if row and row[0] else 0
    deleted = len(await tx.fetch("schedule_compaction_delete", params))
    if not deleted:
        return 0
    totals = {
        "fired": state.fired,
        "skipped": state.skipped,
        "lastJobId": state.last_job_id,
        "latestFireTime": state.latest_fire_time.isoformat() if state.latest_fire_time else None,
    }
    # Appended first: the earlier compactions it supersedes are then all below it, so the
    # stream's head is never deleted (an earlier one may have been the head).
    new = await append(tx, state, stream, [Draft(COMPACTED, totals)])
    earlier = {"stream": stream, "below": new.seq}
    return deleted + len(await tx.fetch("schedule_compaction_drop_compacted", earlier))


async def compact(
    store: Store, cutoff: datetime, batch: int, *, after: str = "", dry_run: bool = False
) -> Compacted:
    """One batch: up to `batch` schedules after `after`, each in its own transaction."""
    schedules = receipts = 0
    found = await candidates(store, cutoff, batch, after)
    for schedule_id in found:
        with translate_errors():
            async with store.transaction() as tx:
                deleted = await compact_in(tx, schedule_id, cutoff, dry_run=dry_run)
        if deleted:
            schedules, receipts = schedules + 1, receipts + deleted
    return Compacted(schedules, receipts, found[-1] if found else None)
