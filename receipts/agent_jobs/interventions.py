"""What reaches an agent job from outside its turns: its owner's answer, a cancel (its owner's or
an operator's), the input timeout, a steer or follow-up to its turn. Each under the job's row
lock, as the turns' (receipts/agent_jobs/lifecycle.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from receipts import operations as ops
from receipts.agent_jobs import decisions, model
from receipts.agent_jobs.lifecycle import append, job_for_update
from receipts.agent_jobs.metrics import AGENT_JOB_EVENTS
from receipts.agent_jobs.model import AgentJob
from receipts.commands import payload_bytes
from receipts.enqueue import cancel_queued_draft
from receipts.errors import ConflictError, NotFoundError
from receipts.jobs import Job
from receipts.kinds import TURN_KIND
from receipts.mutate import Decide, Outcome, apply, mutate
from receipts.store import Draft, Store, Tx
from receipts.streams import json_bytes, same_json

log = logging.getLogger("receipts.agent_jobs")

FOLLOW_UPS_FULL = "agent_job_follow_ups_full"
"""A follow-up refused: its agent job holds its cap of follow-ups for its next turn."""


class NotWaiting(ConflictError):
    """The job is not waiting for an answer (or has one already)."""


class AlreadyTerminal(ConflictError):
    """The job is succeeded, failed or stopped: it takes nothing more."""


async def answer(
    store: Store, agent_job_id: str, *, answer: Any, tool_call_id: str | None
) -> AgentJob:
    """Record the answer of a waiting job; the dispatcher, woken by it, continues the job as
    soon as its agent has a free slot and its organization a free dispatch slot (one claim
    path, where both are known: `claim`).

    The same answer again, while it is the job's latest (waiting for its slot, or continued
    with it since), is answered as it stands (a client retrying a reply it lost); another is
    refused.

    Raises `NotFoundError`, `NotWaiting` (not waiting, already answered, or another tool call).
    """
    async with store.transaction() as tx:
        job = await job_for_update(tx, agent_job_id)
        if job is None:
            raise NotFoundError(f"no agent job {agent_job_id!r}")
        assert job is not None
        pending = job.pending_tool_call
        if job.answer is not None:
            # Its latest answer, kept until it asks again: waiting for a slot, or the turn it
            # started running (or finished) since.
            given = job.answer.get("toolCallId")
            if same_json(job.answer, {"toolCallId": tool_call_id or given, "answer": answer}):
                return job  # the same answer again (a client retrying a lost reply): as it was
            if job.status == "waiting_on_user":
                raise NotWaiting(f"agent job {agent_job_id!r} is already answered")
        if job.status != "waiting_on_user":
            raise NotWaiting(f"agent job {agent_job_id!r} is {job.status}, not waiting for input")
        if (
            tool_call_id is not None
            and pending is not None
            and tool_call_id != pending.tool_call_id
        ):
            raise NotWaiting(
                f"agent job {agent_job_id!r} waits for tool call {pending.tool_call_id!r}"
            )
        call_id = tool_call_id or (pending.tool_call_id if pending else None)
        job = await append(
            tx, job, [Draft(model.ANSWERED, {"toolCallId": call_id, "answer": answer})]
        )
    AGENT_JOB_EVENTS.labels("answered").inc()
    log.info(
        "agent job answered",
        extra={"event": "agent_job.answered", "agentJobId": agent_job_id, "status": job.status},
    )
    return job


async def cancel(store: Store, agent_job_id: str, *, reason: str) -> AgentJob:
    """Drive the job to `stopped` at once, whatever its status: its slot is free in the same
    transaction. A live turn is not yanked out from under its worker: it finishes or fails on
    its own, and every write its end would make to the job (a transition, a wakeup, the next
    turn) is refused by the fence of `settle_turn_in` (the job is no longer `running` on that
    turn). A turn whose queue job has not started yet is no live turn: it is canceled with the
    job. Raises `NotFoundError`, `AlreadyTerminal`."""
    async with store.transaction() as tx:
        job = await job_for_update(tx, agent_job_id)
        if job is None:
            raise NotFoundError(f"no agent job {agent_job_id!r}")
        if job.terminal:
            raise AlreadyTerminal(f"agent job {agent_job_id!r} is {job.status}")
        live_turn = None
        if job.status == "running" and job.queue_job_id is not None:
            live_turn = await _release_turn(tx, job.queue_job_id, reason)
        data = decisions.stop_data(job, reason)
        if live_turn is not None:
            data["liveTurnJobId"] = live_turn
        job = await append(tx, job, [Draft(model.TRANSITIONED, data)])
    AGENT_JOB_EVENTS.labels("canceled").inc()
    log.info(
        "agent job stopped",
        extra={
            "event": "agent_job.cancel",
            "agentJobId": agent_job_id,
            "status": job.status,
            "liveTurnJobId": live_turn,
        },
    )
    return job


async def _release_turn(tx: Tx, turn_job_id: str, reason: str) -> str | None:
    """A stopped job's turn: canceled if its queue job is still queued (no worker holds it);
    left to run if a worker does. Returns the id of a turn left running, else None."""
    turn_job = await tx.job_for_update(turn_job_id)
    if turn_job is None or turn_job.terminal:
        return None
    if turn_job.status == "queued":
        await tx.append_job(turn_job.job_id, turn_job, [cancel_queued_draft(turn_job, reason)])
        return None
    return turn_job.job_id


async def fail_overdue_input(
    store: Store, agent_job_id: str, *, timeout_ms: int
) -> AgentJob | None:
    """Fail a job that waited for input past `timeout_ms` (re-checked under its row lock)."""
    async with store.transaction() as tx:
        job = await job_for_update(tx, agent_job_id)
        if job is None or job.status != "waiting_on_user" or job.answer is not None:
            return None
        now = await tx.now()
        if (now - job.updated_at).total_seconds() * 1000 < timeout_ms:
            return None
        failed = await append(
            tx, job, [Draft(model.TRANSITIONED, decisions.input_timeout_data(job, timeout_ms))]
        )
    AGENT_JOB_EVENTS.labels("input_timeout").inc()
    log.info(
        "agent job failed waiting for its owner's answer",
        extra={
            "event": "agent_job.input_timeout",
            "agentJobId": agent_job_id,
            "timeoutMs": timeout_ms,
        },
    )
    return failed


async def add_command(
    store: Store,
    job_id: str,
    *,
    type: str,
    max_follow_up_bytes: int | None = None,
    **command: Any,
) -> Outcome:
    """`receipts.operations.add_command`, but a steer or follow-up to an agent job's turn is
    taken only while its agent job runs on that turn (`add_turn_command`): one accepted after
    the job stopped was consumed by the turn's end and handed to no turn. With
    `max_follow_up_bytes`, a follow-up to a turn is taken only while the job's follow-ups for
    its next turn stay within it (`agent_job_follow_ups_full`)."""
    decide = ops.command_decision(type=type, **command)
    cap = None
    if type == "follow_up" and max_follow_up_bytes is not None:
        cap = FollowUpCap(json_bytes(command.get("payload")), max_follow_up_bytes)
    turned = None if type == "abort" else await add_turn_command(store, job_id, decide, cap)
    if turned is not None:
        return turned
    return await mutate(store, job_id, decide)


@dataclass(frozen=True, slots=True)
class FollowUpCap:
    """A follow-up's bytes (`json_bytes`) and the most its agent job may hold for its next turn."""

    size: int
    max_bytes: int


async def add_turn_command(
    store: Store, turn_job_id: str, decide: Decide, cap: FollowUpCap | None = None
) -> Outcome | None:
    """A steer or follow-up to an agent job's turn, appended under the agent job's row lock (the
    order a cancel takes: the agent job, then its turn): refused, `agent_job_not_running`,
    unless the agent job still runs on this turn. A follow-up under `cap` is refused,
    `agent_job_follow_ups_full`, when with those the job carries (`followUp`: a turn that fails
    hands them on with its own) and those sent to this turn its next turn would be handed more
    than `cap.max_bytes`: each is copied into the job's state and receipts, every read of it,
    and the next turn's request. None when `turn_job_id` is no agent job's turn (the caller
    appends as for any job)."""
    agent_job_id = model.agent_job_id_of_queue_job(turn_job_id)
    if agent_job_id is None:
        return None
    async with store.transaction() as tx:
        turn = await tx.job(turn_job_id)  # its kind never changes
        if turn is None or turn.kind != TURN_KIND:
            return None
        job = await job_for_update(tx, agent_job_id)
        turn = await tx.job_for_update(turn_job_id)
        decision = decide(turn, await tx.now())
        running = job is not None and job.status == "running" and job.queue_job_id == turn_job_id
        if isinstance(decision, list) and not running:
            decision = ops.AGENT_JOB_NOT_RUNNING
        elif isinstance(decision, list) and cap is not None and job is not None and turn:
            held = await _follow_up_bytes(tx, job, turn)
            if held + cap.size > cap.max_bytes:
                decision = FOLLOW_UPS_FULL
        return await apply(tx, turn_job_id, turn, decision)


async def _follow_up_bytes(tx: Tx, job: AgentJob, turn: Job) -> int:
    """The bytes of the follow-ups the running `job`'s next turn would be handed: those it
    carries and those sent to its `turn` (summed where they are stored, not read out)."""
    carried = job.follow_up if isinstance(job.follow_up, list) else [job.follow_up]
    held = sum(json_bytes(payload) for payload in carried if payload is not None)
    sent = [c for c in turn.commands if c.type == "follow_up"]
    return held + await payload_bytes(tx, turn.job_id, sent)
