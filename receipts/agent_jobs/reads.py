"""Reads of agent jobs: the dispatcher's and the recovery loops' scans, and the page every
lister shares (the API, the console)."""

from __future__ import annotations

from typing import Any

from receipts.agent_jobs.model import SLOTS_PER_AGENT, AgentJob
from receipts.jobs import Receipt
from receipts.reads import Page, Position, Viewer, page, seen_by
from receipts.store import Store


async def ready(store: Store, limit: int = 200) -> list[tuple[str, str, str | None]]:
    """`(agentJobId, agentId, organizationId)` of jobs waiting only for a slot, oldest first: of
    each agent in each organization with free slots, the oldest, as many as those slots."""
    params = {"limit": limit, "slots": SLOTS_PER_AGENT}
    return [(str(a), str(b), c) for a, b, c in await store.fetch("agent_jobs_ready", params)]


async def settled_turns(store: Store, limit: int = 200) -> list[str]:
    """Running jobs whose turn's queue job is terminal."""
    return [str(r[0]) for r in await store.fetch("agent_jobs_settled_turns", {"limit": limit})]


async def input_overdue(store: Store, timeout_ms: int, limit: int = 200) -> list[str]:
    """Waiting, unanswered jobs whose last change is older than `timeout_ms`."""
    rows = await store.fetch("agent_jobs_input_overdue", {"timeout_ms": timeout_ms, "limit": limit})
    return [str(r[0]) for r in rows]


async def next_available_at(store: Store) -> Any:
    """The soonest future `availableAt` of a queued job, or None."""
    rows = await store.fetch("agent_jobs_next_available_at", {})
    return rows[0][0] if rows else None


async def jobs_page(
    store: Store,
    viewer: Viewer,
    *,
    organization_id: str | None = None,
    status: str | None = None,
    agent_id: str | None = None,
    owner_session_id: str | None = None,
    after: Position | None,
    limit: int,
) -> Page[AgentJob]:
    """A page of the agent jobs `viewer` may see, newest first (None filters match all)."""
    params = {
        **seen_by(viewer, after, "id"),
        "organization_id": organization_id,
        "status": status,
        "agent_id": agent_id,
        "owner_session_id": owner_session_id,
    }
    states, more = await page(store, "agent_jobs_list", params, limit)
    return Page([AgentJob.model_validate(s) for s in states], more)


async def running_by_agent(store: Store) -> list[tuple[str, str, int]]:
    """`(organizationId, agentId, running)` for each agent of an organization with a running
    job: the slots in use (three per agent in each organization)."""
    rows = await store.fetch("agent_jobs_running_by_agent", {})
    return [(str(org or ""), str(agent), int(n)) for org, agent, n in rows]


async def unposted_wakeups(store: Store, url: str, limit: int = 100) -> list[tuple[str, str, int]]:
    """`(sourceId, sessionId, sessionSeq)` of recent wakeups not yet posted to `url`."""
    rows = await store.fetch("agent_wakeups_unposted", {"url": url, "limit": limit})
    return [(str(a), str(b), int(c)) for a, b, c in rows]


async def wakeups_of(store: Store, agent_job_id: str) -> list[Receipt]:
    """The job's `session.wakeup` receipts on its owner's session stream, in order."""
    rows = await store.fetch("agent_job_wakeup_receipts", {"agent_job_id": agent_job_id})
    return [Receipt.from_row(row) for row in rows]
