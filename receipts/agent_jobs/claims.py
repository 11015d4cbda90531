"""Claims: an agent job waiting only for a slot is set running, its turn's queue job enqueued,
in one transaction that takes, in this fixed order, the slot lock of the agent in the job's
organization (three slots each) and then the job row
`FOR UPDATE` (the specification's two claim paths, a new attempt and a continuation), and the
turn's share of its organization's codex workers (docs/agent-jobs.md, Slots)."""

from __future__ import annotations

import logging

from receipts.agent_jobs import decisions, model
from receipts.agent_jobs.lifecycle import (
    NO_SLOT,
    ORGANIZATION_AT_CAP,
    append,
    enqueue_turn,
    job_for_update,
    take_turn_slot,
)
from receipts.agent_jobs.model import AgentJob
from receipts.store import Draft, Store, Tx
from receipts.trace_context import job_trace

log = logging.getLogger("receipts.agent_jobs")


def slot_lock_key(agent_id: str, organization_id: str | None) -> str:
    """The advisory-lock key of an agent's running slots in an organization: agents are the
    deployment's (the registry), and each organization's use of one has its three slots, so
    one tenant's long jobs never hold another's (docs/agent-jobs.md, Slots)."""
    return f"agent-slots:{organization_id or ''}:{agent_id}"


async def running_count(tx: Tx, agent_id: str, organization_id: str | None) -> int:
    """The agent's running jobs of the organization, counted from the projection (the caller
    holds their slot lock)."""
    params = {"agent_id": agent_id, "organization_id": organization_id}
    row = await tx.fetch_one("agent_slots_running", params)
    assert row is not None
    return int(row[0])


class _Unread:
    """The job's organization, not given: `_claim` reads it."""


UNREAD = _Unread()


async def _claim(
    tx: Tx,
    agent_job_id: str,
    agent_id: str,
    expect: str | None,
    org_cap: int,
    organization_id: str | _Unread | None,
) -> AgentJob | str:
    # Its organization (as the dispatcher's read gave it, else read here without a lock: a
    # job's organization never changes) names the slots; then the order is fixed: their slot
    # lock, then the job row FOR UPDATE.
    org: str | None
    if isinstance(organization_id, _Unread):
        row = await tx.fetch_one("agent_job_organization", {"agent_job_id": agent_job_id})
        if row is None:
            return NO_SLOT
        org = row[0]
    else:
        org = organization_id
    await tx.lock_key(slot_lock_key(agent_id, org))
    if await running_count(tx, agent_id, org) >= model.SLOTS_PER_AGENT:
        return NO_SLOT
    job = await job_for_update(tx, agent_job_id)
    if job is None or job.agent_id != agent_id or job.organization_id != org:
        return NO_SLOT
    if expect is not None and job.status != expect:
        return NO_SLOT
    now = await tx.now()
    if not decisions.claimable(job, now):
        return NO_SLOT
    decision = decisions.claim(job, now)
    # The turn takes its organization's dispatch slot on the codex workers first (fair
    # dispatch, receipts/fairness.py), or nothing is written: a job never holds one of its
    # agent's slots while its turn waits behind its organization's cap.
    if not await take_turn_slot(tx, job, decision.queue_job_id, org_cap):
        return ORGANIZATION_AT_CAP  # logged by the dispatcher's pass (`agent_job.held_back`)
    claimed = await append(tx, job, [Draft(model.TRANSITIONED, decision.data)])
    await enqueue_turn(tx, claimed, decision.queue_job_id)
    with job_trace(claimed.traceparent):  # the line in the agent job's trace
        log.info(
            "agent job claimed",
            extra={
                "event": "agent_job.claimed",
                "agentJobId": agent_job_id,
                "agentId": agent_id,
                "attempt": claimed.attempt,
                "turn": claimed.turn,
                "continuation": decision.continuation,
            },
        )
    return claimed


async def claim(
    store: Store,
    agent_job_id: str,
    agent_id: str,
    *,
    org_cap: int = 0,
    expect: str | None = None,
    organization_id: str | _Unread | None = UNREAD,
) -> AgentJob | str:
    """Claim a job waiting only for a slot — queued (a new attempt) or answered while waiting
    (a continuation), or only the status `expect` — if its agent has a free slot and its
    organization a free dispatch slot on the codex workers (`org_cap`, 0: none). Returns the
    claimed job, or why not: `no_slot` (the agent's three are taken, or the job is not
    claimable) or `organization_at_cap`. `organization_id`: the job's, when the caller read it
    (the dispatcher's ready list), else read here."""
    async with store.transaction() as tx:
        return await _claim(tx, agent_job_id, agent_id, expect, org_cap, organization_id)


async def claim_attempt(
    store: Store, agent_job_id: str, agent_id: str, *, org_cap: int = 0
) -> AgentJob | str:
    """The spec's first claim path: a queued job, for a new execution attempt (see `claim`)."""
    return await claim(store, agent_job_id, agent_id, org_cap=org_cap, expect="queued")


async def claim_continuation(
    store: Store, agent_job_id: str, agent_id: str, *, org_cap: int = 0
) -> AgentJob | str:
    """The spec's second: an answered waiting job, to continue (see `claim`)."""
    return await claim(store, agent_job_id, agent_id, org_cap=org_cap, expect="waiting_on_user")
