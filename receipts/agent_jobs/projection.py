"""The `agent_jobs` projection is derived: rebuild it from `agent-jobs/*`, or verify it."""

from __future__ import annotations

import itertools
import logging
from typing import Any

from receipts.agent_jobs import model
from receipts.agent_jobs.lifecycle import projection_params
from receipts.agent_jobs.model import AgentJob
from receipts.sql import query
from receipts.store import Store, _row_receipt

log = logging.getLogger("receipts.agent_jobs.projection")


async def fold_chain_in(conn: Any) -> dict[str, AgentJob]:
    """Fold every agent-job stream read through `conn` (inside a caller's transaction)."""
    cur = await conn.execute(query("agent_job_streams"), {})
    rows = [_row_receipt(r) for r in await cur.fetchall()]
    folded: dict[str, AgentJob] = {}
    for _, receipts in itertools.groupby(rows, key=lambda r: r.stream):
        job = model.fold(receipts)
        if job is not None:
            folded[job.agent_job_id] = job
    return folded


async def rebuild(store: Store) -> int:
    """Replace the `agent_jobs` projection with the fold of the chain, in one transaction
    (appends wait on the table lock meanwhile). Returns the number of agent jobs written."""
    async with store.transaction() as tx:
        await tx.conn.execute(query("agent_jobs_lock"), {})
        folded = await fold_chain_in(tx.conn)
        await tx.conn.execute(query("agent_jobs_clear"), {})
        async with tx.conn.cursor() as cur:
            await cur.executemany(
                query("agent_job_upsert"), [projection_params(j) for j in folded.values()]
            )
    log.info(
        "agent-job projection rebuilt",
        extra={"event": "projections.agent_jobs_rebuilt", "agentJobs": len(folded)},
    )
    return len(folded)


async def verify(store: Store) -> list[str]:
    """Compare the live projection with the fold of the chain; one line per difference."""
    async with store.transaction() as tx:
        await tx.conn.execute(query("agent_jobs_share_lock"), {})
        folded = await fold_chain_in(tx.conn)
        cur = await tx.conn.execute(query("agent_jobs_states"), {})
        live = {row[0]: AgentJob.model_validate(row[1]) for row in await cur.fetchall()}
    problems = [
        f"agent job {i}: in the projection but not in the chain"
        for i in live.keys() - folded.keys()
    ]
    problems += [
        f"agent job {i}: in the chain but not in the projection"
        for i in folded.keys() - live.keys()
    ]
    for agent_job_id in sorted(folded.keys() & live.keys()):
        if folded[agent_job_id] != live[agent_job_id]:
            problems.append(
                f"agent job {agent_job_id}: projection differs from the fold of its chain"
            )
    return problems
