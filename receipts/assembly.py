"""The runtime's parts put together: the store's settlement policies and every projection.

The store (receipts/store.py) knows streams, receipts, projections and transactions, and
nothing of the layers above it; each aggregate declares its projection, and the Factory
declares what it writes when a job settles. This module, above all of them, is the one place
that lists them, for the processes to open the store with (`open_store`) and for `receipt
rebuild-projections` (`rebuild`, `verify`) and `receipt restored` (`restored`).
"""

from __future__ import annotations

import logging
from typing import Any

from receipts.agent_jobs.projection import AGENT_JOBS
from receipts.objectives.store import CONTROL_OUTBOX, OBJECTIVES
from receipts.projections import JOBS, Projection
from receipts.schedules.store import SCHEDULES
from receipts.store import SettlementPolicy, Store

log = logging.getLogger("receipts.assembly")

# Run in every job append, in this order.
POLICIES: tuple[SettlementPolicy, ...] = (CONTROL_OUTBOX,)
PROJECTIONS: tuple[Projection[Any], ...] = (JOBS, OBJECTIVES, AGENT_JOBS, SCHEDULES)
# How far `restored` moves the id sequences: more ids than any history lost by a restore took
# (webhook delivery ids are permuted below 2**62, receipts/webhook_ids.py: 2**30 restores).
RESTORE_ID_GAP = 1 << 32


async def open_store(url: str, **pool: Any) -> Store:
    """Open the store on `url` with the runtime's settlement policies; `pool` (sizes, timeouts,
    session settings) as `Store.open` takes it."""
    return await Store.open(url, policies=POLICIES, **pool)


async def rebuild(store: Store) -> dict[str, int]:
    """Replace every projection with the fold of the chain, in one transaction (appends wait
    on the table locks meanwhile). Returns the rows written per table."""
    async with store.transaction() as tx:
        counts = {p.table: await p.rebuild_in(tx) for p in PROJECTIONS}
    log.info("projections rebuilt", extra={"event": "projections.rebuilt", **counts})
    return counts


async def verify(store: Store) -> list[str]:
    """Compare every projection with the fold of the chain, in one read-only snapshot that
    locks nothing (appends go on meanwhile); one line per difference."""
    async with store.transaction() as tx:
        await tx.execute("snapshot_read_only", {})
        return [line for p in PROJECTIONS for line in await p.verify_in(tx)]


async def restored(store: Store) -> dict[str, int]:
    """After a restore to an earlier point, before the roles start (docs/operations.md,
    *Backups*): rebuild every projection (a rebuilt schedule is unsynced, so the sync writes
    each to Temporal again, over a definition or pause of the lost history) and move the id
    sequences `RESTORE_ID_GAP` ahead, so no id the lost history issued is issued again."""
    counts = await rebuild(store)
    await store.fetch("advance_id_sequences", {"gap": RESTORE_ID_GAP})
    log.info("ids advanced after a restore", extra={"event": "projections.restored"})
    return counts
