"""Objective persistence: fenced appends to `objectives/<id>` with the projection row, the
control-request outbox and its delivery to a control job.

Lock order (so that no two transactions wait on each other in a cycle): job rows first, then
the objective's stream — a job's settle or lease expiry that asks for control, a control pass
enqueuing task jobs, a handler's write (its `guard` locks its own row first). The one
exception is the objective's control jobs: delivering a control request takes the stream and
then the control session key and the control job rows, and a control job's own guard takes
the stream before its row. No other path locks a control job's row and then the stream.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

from receipts import webhooks
from receipts.enqueue import EnqueueRequest, enqueue_in
from receipts.jobs import Job, Receipt
from receipts.kinds import CONTRACTS
from receipts.objectives import audit
from receipts.objectives import metrics as factory_metrics
from receipts.objectives.model import (
    ObjectiveState,
    ObjectiveSummary,
    control_job_id,
    fold,
    objective_stream,
    session_key,
)
from receipts.projections import Projection
from receipts.reads import Page, Position, Viewer, page, seen_by
from receipts.store import Draft, SettlementPolicy, Store, Tx, translate_errors
from receipts.tenancy import scoped_id

log = logging.getLogger("receipts.objectives")

CONTROL_KIND = "factory.objective.control"
CONTROL_AGENT = "factory-control"
CONTROL_MAX_ATTEMPTS = 3
RECONCILING_KINDS: frozenset[str] = frozenset(
    kind for kind, contract in CONTRACTS.items() if contract.reconciles_objective
)

Decide = Callable[[ObjectiveState | None], Sequence[Draft]]
# Run with the transaction and the objective's id before `update` locks the stream and decides;
# raises to refuse the whole transaction. A handler's writes pass one that holds its attempt's
# fence (`activities/handlers/fenced.py`), so a delivery that lost its lease writes nothing here.
Guard = Callable[[Tx, str], Awaitable[None]]

OBJECTIVES = Projection("objectives", ObjectiveState, fold, "objective_upsert", noun="objective ")


async def load(tx: Tx, objective_id: str) -> ObjectiveState | None:
    """The objective's folded state read inside `tx` to write after it: its row locked, so a
    projection rebuild waits for the write (lock its stream first)."""
    row = await tx.fetch_one("objective_get_for_update", {"objective_id": objective_id})
    return ObjectiveState.model_validate(row[0]) if row else None


async def get(store: Store | Tx, objective_id: str) -> ObjectiveState | None:
    """The objective's folded state from the projection, or None."""
    with translate_errors():
        row = await store.fetch_one("objective_get", {"objective_id": objective_id})
    return ObjectiveState.model_validate(row[0]) if row else None


async def named(store: Store | Tx, objective_id: str) -> list[str]:
    """The runtime ids of the objectives an admin may mean by `objective_id` (an
    organization's own id): at most two, enough to tell one from ambiguous."""
    with translate_errors():
        rows = await store.fetch("objectives_by_caller_id", {"objective_id": objective_id})
    return [str(row[0]) for row in rows]


async def runtime_id(
    store: Store | Tx, organization_id: str | None, objective_id: str, *, existing: bool = True
) -> str:
    """The runtime's id of the objective `organization_id` calls `objective_id`: `<id>~<tag>`
    (`receipts/tenancy.py`). With `existing`, an objective of that organization created before
    ids were scoped, which kept its plain id, is found under it when no scoped one exists."""
    scoped = scoped_id(organization_id, objective_id)
    if organization_id is None or not existing or await get(store, scoped) is not None:
        return scoped
    earlier = await get(store, objective_id)
    if earlier is not None and earlier.organization_id == organization_id:
        return objective_id
    return scoped


def of_organization(
    state: ObjectiveState | None, organization_id: str | None
) -> ObjectiveState | None:
    """`state` when it belongs to `organization_id` (None: the runtime's own work, such as the
    watchdog's, which may act on every organization's objectives); None otherwise, so another
    organization's objective is treated exactly as one that does not exist."""
    if state is None or organization_id is None or state.organization_id == organization_id:
        return state
    return None


async def update(
    tx: Tx,
    objective_id: str,
    decide: Decide,
    guard: Guard | None = None,
    *,
    organization_id: str | None = None,
    existing_only: bool = False,
) -> tuple[ObjectiveState | None, list[Receipt]]:
    """Lock the objective's stream, let `decide` choose receipts from its current state, append
    them and update the projection, in the caller's transaction. Returns the new state and the
    receipts written (none when `decide` chose none). `guard` runs first and may refuse the
    transaction by raising. With `organization_id`, another organization's objective is left
    alone: `decide` is not asked and nothing is written (the answer is as for one that does not
    exist, `(None, [])`). With `existing_only`, an objective that does not exist is not locked
    and `decide` is not asked (`(None, [])`): one round trip for a job's made-up objective id."""
    if guard is not None:
        await guard(tx, objective_id)
    stream = objective_stream(objective_id)
    if existing_only:
        exists = await tx.lock_stream_if(
            stream, "objective_lock_if_exists", {"objective_id": objective_id}
        )
        if not exists:
            return None, []
    else:
        await tx.lock_streams([stream])
    found = await load(tx, objective_id)
    state = of_organization(found, organization_id)
    if found is not None and state is None:
        return None, []
    drafts = list(decide(state))
    if not drafts:
        return state, []
    receipts = await tx.append(stream, drafts, expected_seq=state.seq if state else 0)
    new = fold(receipts, state)
    assert new is not None
    await OBJECTIVES.put(tx, new)
    if new.terminal and (state is None or not state.terminal):
        # Settled now: owed to its organization's webhooks with the receipt that settles it.
        await webhooks.owe(
            tx,
            new.organization_id,
            webhooks.OBJECTIVE_EVENT,
            event_key=new.objective_id,
            subject=new.objective_id,
            data={"objective": new.to_json()},
        )
    return new, receipts


def control_request(reason: str, **detail: Any) -> Draft:
    """An `objective.control_requested` receipt (the outbox entry)."""
    return Draft("objective.control_requested", {"reason": reason, **detail})


async def request_control(
    tx: Tx,
    objective_id: str,
    reason: str,
    *,
    deliver_now: bool = True,
    guard: Guard | None = None,
    organization_id: str | None = None,
    **detail: Any,
) -> ObjectiveState | None:
    """Record a control request and, with `deliver_now`, hand it to a control job in the same
    transaction. Does nothing for an objective that does not exist (or, with `organization_id`,
    belongs to another organization)."""

    def decide(state: ObjectiveState | None) -> list[Draft]:
        return [control_request(reason, **detail)] if state is not None else []

    state, _ = await update(
        tx, objective_id, decide, guard, organization_id=organization_id, existing_only=True
    )
    if state is not None and deliver_now:
        state = await deliver(tx, objective_id)
    return state


async def deliver(tx: Tx, objective_id: str) -> ObjectiveState | None:
    """Hand the objective's outstanding control requests to a control job (in `tx`).

    The job is enqueued on the session key `objective:<id>` with singleton `steer`: an active
    control job absorbs the request as a steer command, so at most one control job per
    objective is active. Its id names the stream head it was delivered at, so redelivering one
    observed state creates nothing. A terminal objective's requests are marked delivered
    without a job.
    """
    stream = objective_stream(objective_id)
    await tx.lock_streams([stream])
    state = await load(tx, objective_id)
    if state is None or not (state.control_pending or state.needs_reconcile):
        return state
    job_id: str | None = None
    outcome = "none"
    if not state.terminal:
        result = await enqueue_in(
            tx,
            EnqueueRequest(
                agent_id=CONTROL_AGENT,
                payload={
                    "kind": CONTROL_KIND,
                    "objectiveId": objective_id,
                    "reason": state.last_control_reason or "reconcile",
                    "authContext": state.auth_context,
                },
                kind=CONTROL_KIND,
                organization_id=state.organization_id,
                job_id=control_job_id(objective_id, state.seq),
                session_key=session_key(objective_id),
                singleton_mode="steer",
                max_attempts=CONTROL_MAX_ATTEMPTS,
                traceparent=state.traceparent,
            ),
        )
        job_id, outcome = result.job.job_id, result.outcome
    through = state.control_requested_seq
    new, _ = await update(
        tx,
        objective_id,
        lambda _: [
            Draft(
                "objective.control_delivered",
                {"throughSeq": through, "controlJobId": job_id, "outcome": outcome},
            )
        ],
    )
    factory_metrics.FACTORY_CONTROL_DELIVERIES.labels(outcome).inc()
    log.info(
        "objective control delivered",
        extra={
            "event": "factory.control_delivered",
            "objectiveId": objective_id,
            "jobId": job_id,
            "outcome": outcome,
        },
    )
    return new


def _control_wanted(before: Job | None, job: Job, drafts: Sequence[Draft]) -> bool:
    """A reconciling kind's job of an objective became terminal or had its lease expire."""
    if job.kind not in RECONCILING_KINDS or not isinstance(job.payload.get("objectiveId"), str):
        return False
    expired = any(d.type == "job.lease_expired" for d in drafts)
    return expired or (job.terminal and (before is None or not before.terminal))


async def lock_objective(tx: Tx, objective_id: str, guard: Guard | None = None) -> None:
    """Take the objective's stream lock (if it exists), then `guard`'s (a control job's fence:
    its row), before a job write of this transaction: a job write locks its organization's
    open-jobs counter row, which a delivery takes after the stream and the control job rows,
    so taking it after them here too leaves no cycle (docs/factory.md, "Lock order")."""
    await tx.lock_stream_if(
        objective_stream(objective_id), "objective_lock_if_exists", {"objective_id": objective_id}
    )
    if guard is not None:
        await guard(tx, objective_id)


async def _control_lock(tx: Tx, job: Job) -> None:
    await lock_objective(tx, str(job.payload["objectiveId"]))


async def _control_write(tx: Tx, before: Job | None, job: Job, drafts: Sequence[Draft]) -> None:
    expired = any(d.type == "job.lease_expired" for d in drafts)
    await request_control(
        tx,
        str(job.payload["objectiveId"]),
        "lease_expired" if expired else "job_terminal",
        deliver_now=False,
        organization_id=job.organization_id,
        jobId=job.job_id,
        jobStatus=job.status,
    )


# The store's settlement policy for the contract flag "reconcile objective on terminal or
# expired lease": in the transaction that made a reconciling kind's job terminal or wrote its
# `job.lease_expired`, record a control request on its objective's stream (delivered by the
# outbox redrive). An objective that does not exist, or is another organization's, gets
# nothing; so does a job of any other kind.
CONTROL_OUTBOX = SettlementPolicy(wants=_control_wanted, write=_control_write, lock=_control_lock)


async def objectives_page(
    store: Store,
    viewer: Viewer,
    *,
    organization_id: str | None = None,
    status: str | None = None,
    after: Position | None,
    limit: int,
) -> Page[ObjectiveSummary]:
    """A page of the objectives `viewer` may see, newest first (None filters match all): each
    one's summary, not its state (which holds every task)."""
    params = {
        **seen_by(viewer, after, "objective_id"),
        "organization_id": organization_id,
        "status": status,
    }
    rows, more = await page(store, "api_list_objectives", params, limit, whole_rows=True)
    return Page([ObjectiveSummary(*row) for row in rows], more)


async def active(
    store: Store, limit: int, tick: int = 0
) -> tuple[list[ObjectiveState], datetime | None]:
    """Up to `limit` active objectives, least recently changed first, and the database clock
    (None when there are none). With more than `limit` active, tick `tick` reads window
    `tick` modulo their number of windows: the oldest window alone was read every tick, and a
    healthy objective quietly running a long task (never changed, so always among the oldest)
    kept an objective stuck behind the limit from ever being looked at."""
    with translate_errors():
        rows = await store.fetch("objectives_active", {"limit": limit, "tick": tick})
    return [ObjectiveState.model_validate(row[0]) for row in rows], (rows[0][1] if rows else None)


async def under_control(store: Store, states: Sequence[ObjectiveState]) -> set[str]:
    """The ids of those objectives that have an active control job."""
    if not states:
        return set()
    params = {
        "organization_ids": [s.organization_id for s in states],
        "session_keys": [session_key(s.objective_id) for s in states],
    }
    with translate_errors():
        keys = {row[0] for row in await store.fetch("active_control_jobs", params)}
    return {s.objective_id for s in states if session_key(s.objective_id) in keys}


async def resume_candidates(store: Store, limit: int) -> list[str]:
    """Active objectives with no control request outstanding and no active control job."""
    with translate_errors():
        rows = await store.fetch("objective_resume_candidates", {"limit": limit})
    return [row[0] for row in rows]


async def outbox_candidates(store: Store, limit: int) -> list[str]:
    """Objectives owing a control pass (see the `objective_outbox` statement)."""
    return [row[0] for row in await store.fetch("objective_outbox", {"limit": limit})]


async def redrive_outbox(store: Store, limit: int = 200) -> int:
    """One outbox pass: deliver each owing objective's requests, one transaction each.
    Returns how many were delivered. One that cannot be delivered (logged, counted) does not
    hold back the others: the pass goes on, then raises its first failure, so the loop counts a
    failed pass."""
    delivered, failed = 0, list[Exception]()
    for objective_id in await outbox_candidates(store, limit):
        try:
            async with store.transaction() as tx:
                before = await get(tx, objective_id)  # unlocked: `deliver` locks the stream
                after = await deliver(tx, objective_id)
        except Exception as exc:
            failed.append(exc)
            factory_metrics.FACTORY_OUTBOX_UNDELIVERED.inc()
            log.warning(
                "an objective's control requests could not be delivered; the others go on",
                extra={"event": "factory.outbox_delivery_failed", "objectiveId": objective_id,
                       "error": str(exc)},
            )  # fmt: skip
            continue
        if after is not None and before is not None and after.seq != before.seq:
            delivered += 1
    if failed:
        raise failed[0]
    return delivered


async def recover_lost_audits(store: Store, limit: int = 50) -> int:
    """Audit the settled objectives whose audit job ended without auditing them (it failed its
    attempts, or was aborted): the audit is a pure summary of the objective and its jobs, so it
    is written here as the job would have written it. Without it an objective stayed unaudited
    for good, and its event stream and `receipt objectives run --wait` never ended. Returns how
    many were audited."""
    recovered = 0
    for objective_id, job_status in await store.fetch("objectives_audit_lost", {"limit": limit}):
        try:
            written = await _recover_audit(store, objective_id, job_status)
        except Exception as exc:  # one that cannot be audited must not stop the others
            factory_metrics.FACTORY_AUDITS_UNRECOVERED.inc()
            log.warning(
                "a lost audit could not be written; the others go on",
                exc_info=True,
                extra={"event": "factory.audit_recovery_failed", "objectiveId": objective_id,
                       "error": str(exc)},
            )  # fmt: skip
            continue
        if written:
            recovered += 1
            factory_metrics.FACTORY_AUDITS_RECOVERED.inc()
            log.warning(
                "an objective's audit job ended without auditing it; audited by the redrive",
                extra={"event": "factory.audit_recovered", "objectiveId": objective_id,
                       "auditJobStatus": job_status},
            )  # fmt: skip
    return recovered


async def _recover_audit(store: Store, objective_id: str, job_status: str) -> bool:
    state = await get(store, objective_id)
    if state is None or state.audit is not None:
        return False
    summary = audit.summary(state, await jobs_by_ids(store, audit.jobs_to_read(state)))
    data = {
        "summary": summary,
        "jobId": state.audit_job_id,
        "recovered": f"its audit job ended {job_status} without auditing",
    }
    async with store.transaction() as tx:
        _, written = await update(tx, objective_id, _audited(data))
    return bool(written)


def _audited(data: dict[str, Any]) -> Decide:
    def decide(current: ObjectiveState | None) -> list[Draft]:
        if current is None or current.audit is not None:
            return []
        return [Draft("objective.audited", data)]

    return decide


async def phase_added_by(store: Store, objective_id: str, job_id: str) -> int | None:
    """The phase the `factory.dispatch` job `job_id` added to the objective, or None."""
    params = {"stream": objective_stream(objective_id), "job_id": job_id}
    with translate_errors():
        row = await store.fetch_one("objective_phase_added_by", params)
    return int(row[0]) if row else None


async def jobs_by_ids(store: Store, job_ids: Sequence[str]) -> dict[str, Job]:
    """The jobs with these ids (absent ones are left out)."""
    if not job_ids:
        return {}
    rows = await store.fetch("jobs_by_ids", {"job_ids": list(job_ids)})
    jobs = [Job.model_validate(row[0]) for row in rows]
    return {job.job_id: job for job in jobs}


async def job_statuses(store: Store, job_ids: Sequence[str]) -> dict[str, str]:
    """The status of each of these jobs (absent ones are left out)."""
    if not job_ids:
        return {}
    with translate_errors():
        rows = await store.fetch("job_statuses", {"job_ids": list(job_ids)})
    return {job_id: status for job_id, status in rows}


class ObjectiveTerminal(Exception):
    """The objective is already settled (a cancel is refused)."""

    def __init__(self, state: ObjectiveState) -> None:
        super().__init__(f"objective {state.objective_id!r} is {state.status}")
        self.state = state


async def request_cancel(tx: Tx, objective_id: str, reason: str) -> ObjectiveState | None:
    """Record a cancel request and hand control to a control job (which aborts the running
    jobs and settles the objective `canceled`). Raises `ObjectiveTerminal` when it is already
    settled; returns None when there is no such objective. A cancel already requested is
    answered as it stands, nothing written again: repeated, each wrote three receipts and a
    command to the control job, past its cap of commands."""

    def decide(current: ObjectiveState | None) -> list[Draft]:
        if current is None:
            return []
        if current.terminal:
            raise ObjectiveTerminal(current)
        if current.cancel_requested:
            return []
        return [
            Draft("objective.cancel_requested", {"reason": reason}),
            control_request("cancel"),
        ]

    state, written = await update(tx, objective_id, decide)
    if state is None or not written:
        return state
    return await deliver(tx, objective_id)
