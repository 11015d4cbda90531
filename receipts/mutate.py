"""Deciding and writing one change of a job: the `Outcome` of an operation, and the two ways a
decision is written — under the job's row lock in a transaction (`mutate`), or, for a delivery's
fenced writes, as one guarded statement on the state it read (`mutate_guarded`,
receipts/guarded.py). receipts/operations.py decides; this module writes."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from receipts.errors import ConflictError
from receipts.guarded import NeedsTransaction, append_if_unchanged
from receipts.jobs import LEASED_STATUSES, Job, Receipt, job_stream
from receipts.store import Draft, Store, Tx

log = logging.getLogger("receipts.operations")

OK = "ok"
# Rejections of a fenced write (docs/design.md §4): STALE_ATTEMPT, LEASE_LOST, TERMINAL_STATE and
# NOT_FOUND come with the fence rule (receipts/jobs.py `fence_rejection`); a write refused
# because a concurrent append won is a settlement conflict.
SETTLEMENT_CONFLICT = "settlement_conflict"


@dataclass(frozen=True, slots=True)
class Outcome:
    """The result of an operation: `status` is `ok` or why nothing was written.

    `already` is set when a settle found its own settlement already committed (an ambiguous
    commit retried), so the caller reports success without a second receipt.
    """

    status: str
    job: Job | None
    receipts: tuple[Receipt, ...] = field(default=())
    already: bool = False

    @property
    def ok(self) -> bool:
        """True when the operation took effect (or had already, for a retried settle)."""
        return self.status == OK


Decision = list[Draft] | str | Outcome
Decide = Callable[[Job | None, datetime], Decision]
Write = Callable[[Job, datetime], Decision]


async def mutate(store: Store, job_id: str, decide: Decide) -> Outcome:
    """Lock the job, let `decide` choose receipts (or a refusal), append them; one transaction.

    A uniqueness conflict on `(stream, seq)` means a concurrent append won; the state is re-read
    and reported as `settlement_conflict`.
    """
    try:
        async with store.transaction() as tx:
            job = await tx.job_for_update(job_id)
            return await apply(tx, job_id, job, decide(job, await tx.now()))
    except ConflictError:
        log.warning("append conflict", extra={"event": "job.append_conflict", "jobId": job_id})
        return Outcome(SETTLEMENT_CONFLICT, await store.get_job(job_id))


async def apply(tx: Tx, job_id: str, job: Job | None, decision: Decision) -> Outcome:
    """Carry out `decision` on `job` (locked in `tx`): a refusal as it is, receipts appended."""
    if isinstance(decision, Outcome):
        return decision
    if isinstance(decision, str):
        return Outcome(decision, job)
    new, receipts = await tx.append_job(job_id, job, decision)
    return Outcome(OK, new, tuple(receipts))


# A guarded write refused this many times in a row (the job kept changing under it: commands
# arriving, heartbeats of a takeover) is written under the row lock instead.
GUARDED_TRIES = 3

Known = tuple[Job | None, datetime]


async def mutate_guarded(
    store: Store, job_id: str, decide: Decide, known: Known | None = None
) -> Outcome:
    """`mutate` in two round trips instead of four: read the job with the database clock (or
    take `known`, a read the caller just made), decide, and write the decision as one statement
    guarded on that read (receipts/guarded.py). A refused write wrote nothing: read, decide and
    write again. An append a settlement policy wants, or a job that does not exist yet, takes
    the locked path."""
    async with store.session() as session:
        for _ in range(GUARDED_TRIES):
            job, now = known if known is not None else await session.job_with_now(job_id)
            known = None
            decision = decide(job, now)
            if isinstance(decision, Outcome):
                return decision
            if isinstance(decision, str):
                return Outcome(decision, job)
            if job is None:
                break
            try:
                written = await append_if_unchanged(
                    store,
                    job_id,
                    job,
                    decision,
                    now,
                    lease_held=job.status in LEASED_STATUSES,
                    session=session,
                )
            except NeedsTransaction:
                break
            if written is not None:
                new, receipts = written
                return Outcome(OK, new, tuple(receipts))
    return await mutate(store, job_id, decide)


async def written(store: Store, job_id: str, kind: str, write_id: str) -> bool:
    """True when the job holds a `kind` receipt carrying `writeId` `write_id`: a delivery's
    write whose earlier try committed with its answer lost (the id is the one write's, made
    once and sent with every try of it, so no other write, of this delivery or another, is
    taken for it)."""
    params = {"stream": job_stream(job_id), "type": kind, "write_id": write_id}
    return await store.fetch_one("job_write_found", params) is not None
