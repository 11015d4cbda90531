"""Projections are derived: rebuild the `jobs` table from the receipt chain, or verify it against it."""

from __future__ import annotations

import itertools
import logging
from typing import Any

from receipts import jobs as jobmodel
from receipts.jobs import Job
from receipts.objectives import projection as objective_projection
from receipts.sql import query
from receipts.store import Store, _row_receipt, projection_params

log = logging.getLogger("receipts.projections")


async def rebuild(store: Store) -> int:
    """Replace the `jobs` projection with the fold of the chain, in one transaction.

    Appends are blocked meanwhile (the table is locked in EXCLUSIVE mode), so the rebuilt rows
    are exactly the fold of a consistent chain. Returns the number of jobs written.
    """
    async with store.transaction() as tx:
        await tx.conn.execute(query("projection_lock"), {})
        folded = await fold_chain_in(tx.conn)
        await tx.conn.execute(query("projection_clear"), {})
        async with tx.conn.cursor() as cur:
            await cur.executemany(
                query("projection_insert"), [projection_params(j) for j in folded.values()]
            )
        await objective_projection.rebuild_in(tx.conn)
    log.info("projections rebuilt", extra={"event": "projections.rebuilt", "jobs": len(folded)})
    return len(folded)


async def fold_chain_in(conn: Any) -> dict[str, Job]:
    """Fold every job stream read through `conn` (inside a caller's transaction)."""
    cur = await conn.execute(query("read_job_streams"), {})
    rows = [_row_receipt(r) for r in await cur.fetchall()]
    folded: dict[str, Job] = {}
    for _, receipts in itertools.groupby(rows, key=lambda r: r.stream):
        job = jobmodel.fold(receipts)
        if job is not None:
            folded[job.job_id] = job
    return folded


async def verify(store: Store) -> list[str]:
    """Compare the live projection with the fold of the chain; return one line per difference."""
    async with store.transaction() as tx:
        await tx.conn.execute(query("projection_share_lock"), {})
        folded = await fold_chain_in(tx.conn)
        cur = await tx.conn.execute(query("projection_states"), {})
        live = {row[0]: Job.model_validate(row[1]) for row in await cur.fetchall()}
        objective_problems = await objective_projection.verify_in(tx.conn)
    problems = [
        f"{job_id}: in the projection but not in the chain"
        for job_id in live.keys() - folded.keys()
    ]
    problems += [
        f"{job_id}: in the chain but not in the projection"
        for job_id in folded.keys() - live.keys()
    ]
    for job_id in sorted(folded.keys() & live.keys()):
        if folded[job_id] != live[job_id]:
            problems.append(f"{job_id}: projection differs from the fold of its chain")
    return problems + objective_problems
