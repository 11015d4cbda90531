"""The meter of each organization's model tokens per UTC day (`organization_token_usage`,
migration 0022), which the AI gateway's daily budgets are checked against
(`activities/gateway_budget.py`). Not a receipt: the turns' `agent_job.usage` receipts stay the
record of what each job spent."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from receipts.store import Store


async def add(store: Store, counts: Mapping[str, tuple[int, int, int]]) -> None:
    """Add each organization's `(calls, input tokens, output tokens)` to its row of today (the
    database's day, in UTC), in one statement."""
    await store.fetch(
        "token_usage_add",
        {
            "organizations": list(counts),
            "calls": [c[0] for c in counts.values()],
            "inputs": [c[1] for c in counts.values()],
            "outputs": [c[2] for c in counts.values()],
        },
    )


async def spent_today(store: Store, organization_id: str) -> tuple[int, datetime]:
    """The organization's tokens (in and out) today, and the database's clock."""
    row = await store.fetch_one("token_usage_today", {"organization_id": organization_id})
    assert row is not None  # an aggregate of one row
    return int(row[0]), row[1].astimezone(UTC)
