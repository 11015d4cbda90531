"""The `objectives` projection is derived: rebuild it from the chain, or verify it against it."""

from __future__ import annotations

import itertools
from typing import Any

from receipts.objectives.model import ObjectiveState, fold
from receipts.objectives.store import _params
from receipts.sql import query
from receipts.store import _row_receipt


async def fold_objectives_in(conn: Any) -> dict[str, ObjectiveState]:
    """Fold every objective stream read through `conn` (inside a caller's transaction)."""
    cur = await conn.execute(query("read_objective_streams"), {})
    rows = [_row_receipt(r) for r in await cur.fetchall()]
    folded: dict[str, ObjectiveState] = {}
    for _, receipts in itertools.groupby(rows, key=lambda r: r.stream):
        state = fold(receipts)
        if state is not None:
            folded[state.objective_id] = state
    return folded


async def rebuild_in(conn: Any) -> int:
    """Replace the projection with the fold of the chain (appends blocked meanwhile)."""
    await conn.execute(query("objectives_lock"), {})
    folded = await fold_objectives_in(conn)
    await conn.execute(query("objectives_clear"), {})
    async with conn.cursor() as cur:
        await cur.executemany(query("objective_upsert"), [_params(s) for s in folded.values()])
    return len(folded)


async def verify_in(conn: Any) -> list[str]:
    """One line per objective whose projection row differs from the fold of its stream."""
    await conn.execute(query("objectives_share_lock"), {})
    folded = await fold_objectives_in(conn)
    cur = await conn.execute(query("objectives_states"), {})
    live = {row[0]: ObjectiveState.model_validate(row[1]) for row in await cur.fetchall()}
    problems = [f"objective {o}: not in the chain" for o in live.keys() - folded.keys()]
    problems += [f"objective {o}: not in the projection" for o in folded.keys() - live.keys()]
    problems += [
        f"objective {o}: projection differs from the fold of its chain"
        for o in sorted(folded.keys() & live.keys())
        if folded[o] != live[o]
    ]
    return problems
