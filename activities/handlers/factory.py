"""Factory handlers that run today: the objective watchdog scan (objectives come later)."""

from __future__ import annotations

import asyncio
from typing import Any

from activities.handlers import HandlerContext
from receipts.sql import query
from receipts.store import translate_errors
from receipts.watchdog import REASONS, WatchdogSettings


async def objective_watchdog(ctx: HandlerContext) -> dict[str, Any]:
    """Scan up to the limit of objective streams for the three reconcile reasons.

    The scan runs within the watchdog timeout. Until the Factory layer writes objectives there
    are no `objectives/<id>` streams, so it scans nothing and reconciles nothing.
    """
    settings = WatchdogSettings.from_env()
    async with asyncio.timeout(settings.timeout_ms / 1000):
        with translate_errors():
            async with ctx.store.pool.connection() as conn:
                cur = await conn.execute(query("objective_streams"), {"limit": settings.scan_limit})
                streams = [row[0] for row in await cur.fetchall()]
    return {
        "scanned": len(streams),
        "limit": settings.scan_limit,
        "reconciled": [],
        "reasons": dict.fromkeys(REASONS, 0),
    }
