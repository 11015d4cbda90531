"""The agent job's transactions: create, claim (slot lock, then row), settle a turn, answer,
cancel, input timeout. Each writes the agent job's receipts, its projection row, its owner's
wakeup and its turn's queue job in one transaction (docs/agent-jobs.md)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from receipts import webhooks
from receipts.agent_jobs import decisions, model, protocol
from receipts.agent_jobs.metrics import AGENT_JOB_EVENTS
from receipts.agent_jobs.model import AgentJob
from receipts.agent_jobs.projection import AGENT_JOBS
from receipts.commands import with_payloads
from receipts.enqueue import EnqueueRequest, enqueue_in
from receipts.errors import (
    ConflictError,
    InvalidInput,
    InvariantError,
    ReceiptError,
)
from receipts.jobs import Command, Job, Receipt
from receipts.kinds import TURN_KIND, route
from receipts.store import Draft, Store, Tx
from receipts.tenancy import without_position
from receipts.trace_context import job_trace

log = logging.getLogger("receipts.agent_jobs")


class LiveTurnRunning(ConflictError):
    """A job of the workspace a continuation would share has not finished, or was stopped while
    a turn ran and that turn still runs there."""


@dataclass(frozen=True, slots=True)
class CreateRequest:
    """A validated `POST /agent-jobs` (see `receipts.agent_jobs.requests.parse_create`)."""

    agent_id: str
    organization_id: str
    owner_session_id: str
    source_actor_event_id: str
    source_tool_call_id: str
    reply_route: dict[str, Any]
    input: dict[str, Any]
    user_id: str | None = None
    workspace_template: str | None = None
    continued_from_job_id: str | None = None
    provider_binding: str | None = None
    traceparent: str | None = None
    """The W3C trace context of the create (the api's span): every turn's queue job joins it."""


async def _row(tx: Tx, name: str, params: dict[str, Any]) -> Any:
    return await tx.fetch_one(name, params)


async def job_for_update(tx: Tx, agent_job_id: str) -> AgentJob | None:
    """Lock and return the agent job's projection row (None when there is none)."""
    row = await _row(tx, "agent_job_for_update", {"agent_job_id": agent_job_id})
    if row is None:
        return None
    return AgentJob.model_validate(row[1])


async def get(store: Store, agent_job_id: str) -> AgentJob | None:
    """The agent job's folded state from the projection, or None."""
    row = await store.fetch_one("agent_job_get", {"agent_job_id": agent_job_id})
    return AgentJob.model_validate(row[0]) if row else None


async def session_organization(store: Store, session_id: str) -> str | None:
    """The organization an owner session belongs to, or None when no agent job named it."""
    row = await store.fetch_one("agent_session_get", {"session_id": session_id})
    return str(row[0]) if row else None


async def sessions_named(store: Store, session_id: str) -> list[str]:
    """The runtime ids of the owner sessions an admin may mean by `session_id` (a runtime id,
    or an organization's own id): at most two, enough to tell one from ambiguous."""
    rows = await store.fetch("agent_sessions_by_caller_id", {"session_id": session_id})
    return [str(row[0]) for row in rows]


async def append(tx: Tx, job: AgentJob | None, drafts: Sequence[Draft]) -> AgentJob:
    """Fold `drafts` onto `job` (row locked by the caller), append them to `agent-jobs/<id>`,
    update the projection, and append the owner's wakeup when the job entered a wakeup status.

    A draft the fold refuses raises `InvariantError` before anything is written.
    """
    now = await tx.now()
    folded = job
    entered: list[AgentJob] = []
    start = job.seq if job else 0
    for i, draft in enumerate(drafts):
        receipt = Receipt("", start + i + 1, draft.type, draft.data, now)
        folded = model.apply(folded, receipt)
        if draft.type == model.TRANSITIONED and folded.status in model.WAKEUP_STATUSES:
            entered.append(folded)
    assert folded is not None
    stream = model.stream_of(folded.agent_job_id)
    session = model.session_stream(folded.owner_session_id)
    await tx.lock_streams([stream, session] if entered else [stream])
    await tx.append(stream, drafts, expected_seq=start)
    await AGENT_JOBS.put(tx, folded)
    for state in entered:
        await _wake(tx, state, session)
    return folded


async def _wake(tx: Tx, job: AgentJob, session: str) -> None:
    data = model.wakeup_data(job)
    source_id = data["sourceId"]
    if await _row(tx, "agent_wakeup_exists", {"source_id": source_id}):
        return  # a replayed transition: its wakeup was written once already
    stored = await tx.append(session, [Draft(model.WAKEUP, data)])
    recorded = await _row(
        tx,
        "agent_wakeup_record",
        {
            "source_id": source_id,
            "agent_job_id": job.agent_job_id,
            "session_id": job.owner_session_id,
            "session_seq": stored[0].seq,
        },
    )
    if recorded is None:
        raise ConflictError(f"wakeup {source_id} written concurrently")
    # Owed to the organization's webhooks in this transaction: with the wakeup, or not at all.
    await webhooks.owe(
        tx,
        job.organization_id,
        webhooks.WAKEUP_EVENT,
        event_key=source_id,
        subject=job.agent_job_id,
        # The organization's receiver: the wakeup without its global position (tenancy.py).
        data={"sessionId": job.owner_session_id, "wakeup": without_position(stored[0].to_json())},
    )
    AGENT_JOB_EVENTS.labels("wakeup").inc()
    with job_trace(job.traceparent):
        log.info(
            "owner session woken",
            extra={
                "event": "agent_job.wakeup",
                "agentJobId": job.agent_job_id,
                "sourceId": source_id,
            },
        )


# --- create -----------------------------------------------------------------------------------


class AtCap(ReceiptError):
    """The organization holds its cap of unfinished agent jobs: nothing was created."""


async def create(
    store: Store, request: CreateRequest, max_open: int | None = None
) -> tuple[AgentJob, bool]:
    """Create the agent job (queued); returns `(job, created)`.

    The owner session is bound to the request's organization on first use (another
    organization naming it raises `ConflictError`). A retried create for the same
    `(organization, ownerSessionId, sourceToolCallId)` returns the job it made. With
    `max_open`, an organization that holds that many unfinished agent jobs gets `AtCap`
    (a retried create still gets its job).
    """
    async with store.transaction() as tx:
        return await create_in(tx, request, max_open)


async def create_in(
    tx: Tx, request: CreateRequest, max_open: int | None = None
) -> tuple[AgentJob, bool]:
    """`create` inside a caller's transaction."""
    await tx.lock_key(f"agent-session:{request.owner_session_id}")
    await tx.execute(
        "agent_session_claim",
        {"session_id": request.owner_session_id, "organization_id": request.organization_id},
    )
    owner = await _row(tx, "agent_session_get", {"session_id": request.owner_session_id})
    if owner is None or owner[0] != request.organization_id:
        raise ConflictError("ownerSessionId belongs to another organization")
    existing = await _row(
        tx,
        "agent_job_by_source",
        {
            "organization_id": request.organization_id,
            "owner_session_id": request.owner_session_id,
            "source_tool_call_id": request.source_tool_call_id,
        },
    )
    if existing is not None:
        return AgentJob.model_validate(existing[0]), False
    if max_open is not None:
        params = {"organization_id": request.organization_id, "cap": max_open}
        held = await _row(tx, "agent_jobs_open_count", params)
        if held is not None and int(held[0]) >= max_open:
            raise AtCap(
                f"the organization has {held[0]} unfinished agent jobs (RECEIPT_ORG_MAX_QUEUED)"
            )
    agent_job_id = str(uuid.uuid4())
    workspace_owner = agent_job_id
    if request.continued_from_job_id is not None:
        previous = await _row(tx, "agent_job_get", {"agent_job_id": request.continued_from_job_id})
        earlier = AgentJob.model_validate(previous[0]) if previous else None
        if earlier is None or earlier.organization_id != request.organization_id:
            raise InvalidInput(
                "continuedFromJobId", f"no agent job {request.continued_from_job_id!r}"
            )
        workspace_owner = earlier.workspace_owner_job_id
        await _workspace_free(tx, workspace_owner)
    data: dict[str, Any] = {
        "agentJobId": agent_job_id,
        "agentId": request.agent_id,
        "organizationId": request.organization_id,
        "userId": request.user_id,
        "ownerSessionId": request.owner_session_id,
        "sourceActorEventId": request.source_actor_event_id,
        "sourceToolCallId": request.source_tool_call_id,
        "replyRoute": request.reply_route,
        "input": request.input,
        "workspaceTemplate": request.workspace_template,
        "continuedFromJobId": request.continued_from_job_id,
        "workspaceOwnerJobId": workspace_owner,
        "providerBinding": request.provider_binding,
    }
    if request.traceparent:
        data["traceparent"] = request.traceparent
    job = await append(tx, None, [Draft(model.CREATED, data)])
    AGENT_JOB_EVENTS.labels("created").inc()
    log.info(
        "agent job created",
        extra={"event": "agent_job.created", "agentJobId": agent_job_id, "agentId": job.agent_id},
    )
    return job, True


async def _workspace_free(tx: Tx, workspace_owner: str) -> None:
    """Raise `LiveTurnRunning` unless every job working in the workspace of `workspace_owner` has
    finished and has no turn still running: a continuation hands the workspace forward, and two
    turns never run in one workspace at once. Under the workspace's lock, so two continuations
    racing for it are one created and one refused."""
    await tx.lock_key(f"agent-workspace:{workspace_owner}")
    busy = await _row(tx, "agent_jobs_workspace_busy", {"workspace_owner": workspace_owner})
    if busy is None:
        return
    agent_job_id, status, live_turn = busy
    if live_turn is not None:
        raise LiveTurnRunning(
            f"agent job {agent_job_id!r} was stopped while its turn {live_turn!r} ran, and "
            "that turn has not ended yet; continue it once it has"
        )
    raise LiveTurnRunning(
        f"agent job {agent_job_id!r} works in this workspace and has not finished (status "
        f"{status}); continue it once it has"
    )


# --- turns ----------------------------------------------------------------------------------

NO_SLOT = "no_slot"
ORGANIZATION_AT_CAP = "organization_at_cap"


async def take_turn_slot(tx: Tx, job: AgentJob, turn_job_id: str, org_cap: int) -> bool:
    """Take the organization's dispatch slot on the turn's worker queue for the turn's queue job,
    before the job is enqueued in the same transaction (`dispatch_claim`, the starter's own
    statement: the starter then finds the slot held); False, taking nothing, when the
    organization's jobs hold every one (`org_cap`; 0: no cap)."""
    row = await tx.fetch_one(
        "dispatch_claim",
        {
            "job_id": turn_job_id,
            "organization_id": job.organization_id,
            "worker_queue": route(model.TURN_AGENT_ID, TURN_KIND),
            "cap": org_cap,
        },
    )
    assert row is not None
    return bool(row[1] or row[2])  # mine, or took one


async def enqueue_turn(tx: Tx, job: AgentJob, queue_id: str) -> None:
    payload = {
        "kind": TURN_KIND,
        "authContext": {
            "userId": job.user_id or f"session:{job.owner_session_id}",
            "organizationId": job.organization_id,
            "sessionId": job.owner_session_id,
            "source": "agent-job",
        },
        "agentJob": {"agentJobId": job.agent_job_id, "attempt": job.attempt, "turn": job.turn},
    }
    result = await enqueue_in(
        tx,
        EnqueueRequest(
            agent_id=model.TURN_AGENT_ID,
            payload=payload,
            kind=TURN_KIND,
            organization_id=job.organization_id,
            job_id=queue_id,
            max_attempts=1,
            traceparent=job.traceparent,
        ),
    )
    if not result.created:
        raise InvariantError(f"turn queue job {queue_id} exists already")


# --- settlement -------------------------------------------------------------------------------


async def settle_turn(
    store: Store, agent_job_id: str, *, retry_base_ms: int, org_cap: int = 0
) -> AgentJob | None:
    """Apply the settled turn of a running job (see `settle_turn_in`)."""
    async with store.transaction() as tx:
        return await settle_turn_in(tx, agent_job_id, retry_base_ms=retry_base_ms, org_cap=org_cap)


async def _record_usage(tx: Tx, job: AgentJob, turn_job: Job) -> AgentJob:
    """The turn's model calls (its result's `usage`, from the AI gateway) as one summary
    receipt on the job's chain, before what the turn decided."""
    usage = turn_job.result.get("usage") if isinstance(turn_job.result, dict) else None
    if not isinstance(usage, dict) or not usage.get("calls"):
        return job
    summary = {
        "turn": job.turn,
        "queueJobId": turn_job.job_id,
        "agentId": job.agent_id,
        "organizationId": job.organization_id,
        "binding": usage.get("binding"),
        **{name: int(usage.get(name) or 0) for name in model.USAGE_TOTALS},
    }
    return await append(tx, job, [Draft(model.USAGE, summary)])


async def settle_turn_in(
    tx: Tx, agent_job_id: str, *, retry_base_ms: int, org_cap: int = 0
) -> AgentJob | None:
    """If the job is running and its turn's queue job is terminal, write what the turn decided:
    a transition (and its wakeup) or the next turn's queue job. The next turn takes its
    organization's codex slot as a claim does (`org_cap`); when it cannot, the job goes back to
    `queued`, its attempt refunded and its follow-ups carried, rather than hold its agent's slot
    while the turn waits. None when nothing was due."""
    job = await job_for_update(tx, agent_job_id)
    if job is None or job.status != "running" or job.queue_job_id is None:
        return None
    turn_job = await tx.job(job.queue_job_id)
    if turn_job is None or not turn_job.terminal:
        return None
    report = decisions.TurnReport(
        status=turn_job.status,
        started=turn_job.attempt > 0,
        result=turn_job.result,
        error=turn_job.error or turn_job.canceled_reason,
        follow_ups=await _follow_ups_of(tx, turn_job),
        earlier_turn_ran=await _earlier_turn_ran(tx, job),
    )
    now = await tx.now()
    decision = decisions.decide_settlement(job, report, now, retry_base_ms=retry_base_ms)
    queue_id = (
        model.queue_job_id(agent_job_id, job.attempt, decision.next_turn)
        if decision.next_turn is not None
        else None
    )
    job = await _record_usage(tx, job, turn_job)
    if queue_id is not None and not await take_turn_slot(tx, job, queue_id, org_cap):
        held = decisions.at_organization_cap(job, decision.next_prompt)
        settled = await append(tx, job, [Draft(model.TRANSITIONED, held)])
        to = settled.status
    elif decision.next_turn is not None and queue_id is not None:
        settled = await append(
            tx,
            job,
            [
                Draft(
                    model.TURN_STARTED,
                    {
                        "turn": decision.next_turn,
                        "queueJobId": queue_id,
                        "followUps": decision.next_prompt,
                    },
                )
            ],
        )
        await enqueue_turn(tx, settled, queue_id)
        to = "running"
    else:
        assert decision.transition is not None
        settled = await append(tx, job, [Draft(model.TRANSITIONED, decision.transition)])
        to = settled.status
    with job_trace(settled.traceparent):  # the line in the agent job's trace
        log.info(
            "agent job turn settled",
            extra={
                "event": "agent_job.turn_settled",
                "agentJobId": agent_job_id,
                "queueJobId": job.queue_job_id,
                "queueStatus": turn_job.status,
                "status": to,
                "attempt": settled.attempt,
                "turn": settled.turn,
            },
        )
    return settled


async def _earlier_turn_ran(tx: Tx, job: model.AgentJob) -> bool:
    """Whether a turn before the live one ended its work (`done`, `needs_input`): the job ran,
    whatever its live turn does (one that met a quota or never started says nothing of it)."""
    earlier = list(job.queue_job_ids[:-1])
    if not earlier or job.started_at is None:
        return False
    row = await tx.fetch_one("agent_job_turns_ran", {"job_ids": earlier})
    return bool(row and row[0])


async def _follow_ups_of(tx: Tx, turn_job: Job) -> tuple[Any, ...]:
    """The follow-ups sent to a settled turn, in order: those its handler read (named in its
    outcome, `followUpsRead`) and those it ended without reading (a turn that never started),
    read from their receipts. A turn that left no outcome (its worker died, it failed) hands on
    every one sent to it, those it had read too: what it did with them is lost with it. An
    outcome of an earlier worker holds those it read whole (`followUps`)."""
    read: list[Any] = []
    completed = turn_job.status == "completed"
    result = turn_job.result if completed else None
    sent = [c for c in turn_job.commands if c.type == "follow_up"]
    named: list[Command] = []
    if isinstance(result, Mapping) and isinstance(result.get("followUps"), list):
        read = list(result["followUps"])
    elif isinstance(result, Mapping) and isinstance(result.get(protocol.FOLLOW_UPS_READ), list):
        by_id = {c.command_id: c for c in sent}
        named = [by_id[i] for i in result[protocol.FOLLOW_UPS_READ] if i in by_id]
    taken = {c.command_id for c in named}
    unread = [
        c
        for c in sent
        if (c.consumed_attempt is None or not completed) and c.command_id not in taken
    ]
    return (
        *read,
        *[c.payload for c in await with_payloads(tx, turn_job.job_id, [*named, *unread])],
    )
