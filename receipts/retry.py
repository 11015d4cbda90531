"""Retry a settled job: a new job with the old one's payload and route, linked both ways.

A terminal job never moves, so a retry is a new job (`retryOf` on its `job.enqueued`) and a
`job.retried` receipt on the old one (`retriedAs`), written in one transaction under the old
job's row lock. Retrying the same job again returns the job its first retry created: a retry is
idempotent, one by one or in bulk, for as long as that job is there (retention may prune it
before the job it retried: then a retry makes a new one, `replaces` naming the pruned one).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace

from receipts import jobs as jobmodel
from receipts.enqueue import Admission, EnqueueRequest, enqueue_in
from receipts.errors import NotPermitted
from receipts.jobs import Job
from receipts.kinds import TURN_KIND
from receipts.store import Draft, Store, Tx
from receipts.tenancy import scoped_id
from receipts.trace_context import current_traceparent, links_to

log = logging.getLogger("receipts.retry")
_tracer = trace.get_tracer("receipt.retry")

# Statuses a job may be retried from: work that ended without completing.
RETRYABLE_STATUSES: tuple[str, ...] = ("failed", "canceled")
MAX_BULK = 500

RETRIED = "retried"  # a new job was created
ALREADY = "already_retried"  # an earlier retry's job is returned
NOT_FOUND = "not_found"
NOT_RETRYABLE = "not_retryable"  # the job is active or completed
AGENT_TURN = "agent_job_turn"  # a turn of an agent job: its agent job retries it, not a caller
REFUSED = "refused"  # `held` refused it (bulk: the job is left as it is, the others go on)
MAX_BULK_REFUSED = 1_000  # refused jobs one bulk retry goes past (each a short transaction)

Held = Callable[[EnqueueRequest], EnqueueRequest]
"""What a retry is held to before it is written, as the api holds a direct enqueue (its
`timeoutMs` capped, its commands on the organization's allow-list as they are now): the
request to write, or `NotPermitted` raised to refuse it, nothing written."""


@dataclass(frozen=True, slots=True)
class RetryOutcome:
    """What a retry did: `status` is one of the four above; `retry` is the new (or earlier) job."""

    status: str
    job: Job | None = None
    retry: Job | None = None


def retry_request(job: Job, new_job_id: str) -> EnqueueRequest:
    """The enqueue of `job`'s retry: same agent, lane, kind, payload, session key and budget.

    The singleton mode is not repeated: a retry is an explicit operator decision and must not
    cancel or be absorbed by the work now on the session key.
    """
    return EnqueueRequest(
        agent_id=job.agent_id,
        payload=dict(job.payload),
        kind=job.kind,
        organization_id=job.organization_id,
        job_id=new_job_id,
        lane=job.lane,
        session_key=job.session_key,
        max_attempts=job.max_attempts,
        retry_of=job.job_id,
    )


async def retry_in(
    tx: Tx,
    job_id: str,
    *,
    organization_id: str | None,
    admin: bool,
    admission: Admission | None = None,
    held: Held | None = None,
) -> RetryOutcome:
    """Retry `job_id` inside a caller's transaction (see the module docstring). `admission`:
    the caps the new job must fit, `held`: what else it is held to (what either raises leaves
    nothing written)."""
    job = await tx.job_for_update(job_id)
    if job is None or not (admin or job.organization_id == organization_id):
        return RetryOutcome(NOT_FOUND)
    earlier = await tx.job(job.retried_as) if job.retried_as is not None else None
    if earlier is not None:
        return RetryOutcome(ALREADY, job, earlier)
    # A retry retention pruned while this job stayed (a delivery it owed, its objective still
    # there) is made again, as a pruned job's id may be posted again (docs/history.md): it was
    # answered 409 "is failed; only failed or canceled jobs are retried", for good.
    if job.status not in RETRYABLE_STATUSES:
        return RetryOutcome(NOT_RETRYABLE, job)
    if job.kind == TURN_KIND:
        # Run again outside its agent job, a turn would repeat its command in the workspace
        # while every write its end makes is refused (the agent job is not running on it), and
        # no retention path would ever take it: the agent job's own attempts retry its turns.
        return RetryOutcome(AGENT_TURN, job)
    # Scoped like every organization's job id (docs/design.md §4), so its organization can name it.
    new_job_id = scoped_id(job.organization_id, f"retry-{uuid.uuid4()}")
    # The retry is a job of its own trace, started here (as a post without a `traceparent` at
    # the api), linked to the trace of the job it retries.
    with _tracer.start_as_current_span(
        "receipt.retry", attributes={"receipt.job_id": job.job_id}, links=links_to(job.traceparent)
    ):
        request = dataclasses.replace(
            retry_request(job, new_job_id), traceparent=current_traceparent()
        )
        created = await enqueue_in(tx, held(request) if held else request, admission)
    data = {"retriedAs": created.job.job_id}
    if job.retried_as is not None:
        data["replaces"] = job.retried_as
    old, _ = await tx.append_job(job_id, job, [Draft(jobmodel.RETRIED, data)])
    return RetryOutcome(RETRIED, old, created.job)


async def retry(
    store: Store,
    job_id: str,
    *,
    organization_id: str | None,
    admin: bool,
    admission: Admission | None = None,
    held: Held | None = None,
) -> RetryOutcome:
    """Retry one job in its own transaction; logs the outcome."""
    async with store.transaction() as tx:
        outcome = await retry_in(
            tx,
            job_id,
            organization_id=organization_id,
            admin=admin,
            admission=admission,
            held=held,
        )
    if outcome.status == RETRIED and outcome.retry is not None:
        log.info(
            "job retried",
            extra={"event": "job.retried", "jobId": job_id, "retryJobId": outcome.retry.job_id},
        )
    return outcome


async def retry_matching(
    store: Store,
    filters: dict[str, Any],
    *,
    organization_id: str | None,
    admin: bool,
    limit: int,
    admission: Admission | None = None,
    held: Held | None = None,
) -> list[RetryOutcome]:
    """Retry up to `limit` (≤ MAX_BULK) jobs that match `filters` and were never retried.

    Each job is retried in a transaction of its own, so one refusal does not undo the others;
    jobs already retried are not selected, so running the same bulk retry twice creates nothing.
    What `admission` raises (the organization's caps reached) stops the run there: the retries
    made stand, and running it again goes on from them. A job `held` refuses is left as it is
    (`REFUSED`, not counted against `limit`) and the others go on, past at most
    MAX_BULK_REFUSED such jobs.
    """
    limit = min(max(limit, 1), MAX_BULK)
    outcomes: list[RetryOutcome] = []
    # Selected again past the ones it tried: a refused job is not retried, so it stays among
    # the oldest candidates, and taken against `limit` it held back every other for good.
    tried: list[str] = []
    refused = 0
    while len(tried) - refused < limit and refused < MAX_BULK_REFUSED:
        rows = await store.fetch(
            "retry_candidates",
            {
                "status": filters.get("status") or "failed",
                "agent_id": filters.get("agent_id"),
                "kind": filters.get("kind"),
                "lane": filters.get("lane"),
                "error": filters.get("error"),
                "organization_id": filters.get("organization_id") if admin else organization_id,
                "tried": tried,
                "limit": limit - (len(tried) - refused),
            },
            prepare=False,  # a generic plan cannot use the organization's index (see `page`)
        )
        refused_before = refused
        for row in rows:
            tried.append(row[0])
            outcome = await _retry_held(store, row[0], organization_id, admin, admission, held)
            refused += outcome.status == REFUSED
            outcomes.append(outcome)
        if not rows or refused == refused_before:
            break  # every candidate taken, or as many as `limit`
    return outcomes


async def _retry_held(
    store: Store,
    job_id: str,
    organization_id: str | None,
    admin: bool,
    admission: Admission | None,
    held: Held | None,
) -> RetryOutcome:
    """One job of a bulk retry: `REFUSED` when `held` refuses it (nothing written)."""
    try:
        return await retry(
            store,
            job_id,
            organization_id=organization_id,
            admin=admin,
            admission=admission,
            held=held,
        )
    except NotPermitted as refused:
        log.info(
            "bulk retry: a job's retry is refused",
            extra={"event": "job.retry_refused", "jobId": job_id, "error": refused.message},
        )
        return RetryOutcome(REFUSED)
