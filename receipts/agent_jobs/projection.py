"""The `agent_jobs` projection is derived: rebuild it from `agent-jobs/*`, or verify it
(receipts/projections.py, `AGENT_JOBS`)."""

from __future__ import annotations

from receipts.projections import AGENT_JOBS, rebuild_tables, verify_tables
from receipts.store import Store


async def rebuild(store: Store) -> int:
    """Replace the `agent_jobs` projection with the fold of the chain, in one transaction
    (appends wait on the table lock meanwhile). Returns the number of agent jobs written."""
    return (await rebuild_tables(store, AGENT_JOBS))[AGENT_JOBS.table]


async def verify(store: Store) -> list[str]:
    """Compare the live projection with the fold of the chain; one line per difference."""
    return await verify_tables(store, AGENT_JOBS)
