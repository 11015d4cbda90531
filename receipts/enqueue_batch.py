"""Group commit of new jobs: enqueues of new jobs that arrive while one is being written are
written together, by one read and one statement, as a database's group commit writes the
transactions that arrived during the last flush.

Only a new job with a made-up id and no session key is batched (`enqueue_new`'s case: no
lookup, lock or scan): it depends on no other job, so writing several in one statement changes
nothing any of them sees. An enqueue that arrives with nothing in flight is written alone, in
its caller's task (`enqueue_new`), so a lone client pays nothing for the batching; the ones
that arrive meanwhile wait, and are written together when it ends, at most `MAX_BATCH` to a
statement. Each waiter gets what `enqueue_new` would have given it: its job, or the error its
own caps or its own write raised (the jobs of one batch share the clock read). The batch's
statements run in a span of their own, `receipt.enqueue_batch`, linked from each caller's.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from opentelemetry import trace

from receipts import metrics
from receipts.enqueue import (
    NEW_JOB_TRIES,
    Admission,
    EnqueueRequest,
    EnqueueResult,
    cap_params,
    enqueue,
    enqueue_new,
    plan_new,
)
from receipts.errors import StorageError, TransientStorageError
from receipts.job_append import JobAppend, insert_params
from receipts.projections import JOBS
from receipts.store import Store
from receipts.streams import dumps

log = logging.getLogger("receipts.enqueue")
_tracer = trace.get_tracer("receipt.enqueue")

MAX_BATCH = 64
"""The most new jobs one statement writes (bounded work per statement; more wait their turn)."""

# The projection columns `enqueue_new_many` takes, one array each (receipts/sql/api.sql): the
# row's id, then the columns a verify compares (`state` goes with the receipts).
_COLUMNS: tuple[str, ...] = ("job_id", *JOBS.columns)

Outcome = EnqueueResult | Exception


def _stopped() -> TransientStorageError:
    """A waiter's answer when the flush is cancelled (the process is ending): a 503, retried."""
    return TransientStorageError("the api stopped while the enqueue was being written; retry it")


def batchable(request: EnqueueRequest) -> bool:
    """True for the enqueues `enqueue_new` writes: a made-up id and no session key."""
    return request.new_job_id and request.session_key is None and request.job_id is not None


async def enqueue_new_many(
    store: Store, items: Sequence[tuple[EnqueueRequest, Admission | None]]
) -> list[Outcome]:
    """Write new jobs (each `batchable`) in one read and one statement; one outcome per item,
    in order: its `EnqueueResult`, or the exception its enqueue raised. It raises nothing of
    its own.

    The read gives the clock and each organization's open jobs; a job is refused (its caps'
    own error) when its organization has no room left once the batch's earlier jobs are
    counted, as one after the other would be. The statement writes an organization's jobs only
    if they all still fit at its own time; those it did not write (the caps moved) are read and
    written again, `NEW_JOB_TRIES` times in all, then enqueued alone (`enqueue`: read, refuse or
    write), as are the jobs a settlement policy wants. A statement that fails wrote nothing:
    its jobs are enqueued alone, one after another (`enqueue.batch_failed`); a transient
    failure (a lost connection: the statement may have committed) is each one's answer, as
    it would have been alone (the api's 503 with Retry-After)."""
    outcomes: list[Outcome | None] = [None] * len(items)
    pending = list(range(len(items)))
    alone: list[tuple[int, str]] = []
    for _ in range(NEW_JOB_TRIES):
        try:
            pending, wanted = await _write_once(store, items, pending, outcomes)
        except TransientStorageError as error:
            for i in pending:
                if outcomes[i] is None:
                    outcomes[i] = error
            pending = []
            break
        except StorageError as error:
            log.warning(
                "batched enqueue failed; enqueueing its jobs one by one",
                extra={"event": "enqueue.batch_failed", "jobs": len(pending), "error": repr(error)},
            )
            alone += [(i, "error") for i in pending if outcomes[i] is None]
            pending = []
            break
        alone += [(i, "policy") for i in wanted]
        if not pending:
            break
    alone += [(i, "caps") for i in pending]
    for i, reason in alone:  # rare: a policy's append, moving caps, a failed statement
        metrics.ENQUEUE_BATCH_ALONE.labels(reason).inc()
        try:
            outcomes[i] = await enqueue(store, items[i][0], items[i][1])
        except Exception as error:
            outcomes[i] = error
    answered: list[Outcome] = []
    for outcome in outcomes:
        assert outcome is not None  # each item was written, refused, or enqueued alone
        answered.append(outcome)
    return answered


async def _write_once(
    store: Store,
    items: Sequence[tuple[EnqueueRequest, Admission | None]],
    pending: list[int],
    outcomes: list[Outcome | None],
) -> tuple[list[int], list[int]]:
    """Read, refuse and write the `pending` items once, filling `outcomes` of those refused or
    written. Returns the items the statement did not write (their caps moved) and those a
    settlement policy wants (the locked path's)."""
    organizations = sorted({a.organization_id for i in pending if (a := items[i][1]) is not None})
    planned: dict[int, JobAppend] = {}
    wanted: list[int] = []
    async with store.session() as session:
        row = await session.fetch_one("enqueue_caps_many", {"organization_ids": organizations})
        assert row is not None
        now: datetime = row[0]
        held = {org: [int(q), int(a)] for org, q, a in zip(row[1], row[2], row[3], strict=True)}
        for i in pending:
            request, admission = items[i]
            assert batchable(request) and request.job_id is not None
            if admission is not None:
                counts = held[admission.organization_id]
                try:
                    admission.refuse(counts[0], counts[1])
                except Exception as refused:  # the caps' own error, the caller's to raise
                    outcomes[i] = refused
                    continue
                counts[0] += 1
                counts[1] += 1
            append = plan_new(store, request, now)
            if append is None:
                wanted.append(i)
            else:
                planned[i] = append
        if not planned:
            return [], wanted
        params = _many_params([(planned[i], items[i][1]) for i in planned], now)
        result = await session.fetch_one("enqueue_new_many", params)
        assert result is not None
        written = set(result[0] or ())
    for i, append in planned.items():
        if append.job_id in written:
            outcomes[i] = EnqueueResult(append.folded, "created")
    return [i for i in planned if outcomes[i] is None], wanted


def _many_params(
    appends: Sequence[tuple[JobAppend, Admission | None]], now: datetime
) -> dict[str, Any]:
    """`enqueue_new_many`'s parameters: one array per column, one element per job, in
    organization order. Each job's insert locks its organization's counter row of the
    backend's slot (migration 0009) until the statement commits: batches of other api processes
    on the same slot lock them in the same order, so they cannot deadlock."""
    appends = sorted(appends, key=lambda pair: pair[0].params["organization_id"] or "")
    assert all(len(append.receipts) == 1 for append, _ in appends)  # its `job.enqueued`
    receipts = [insert_params(append.receipts, {}) for append, _ in appends]
    caps = [cap_params(admission) for _, admission in appends]
    return {
        **{column: [append.params[column] for append, _ in appends] for column in _COLUMNS},
        **{name: [cap[name] for cap in caps] for name in caps[0]},
        "state": [dumps(append.params["state"].obj) for append, _ in appends],
        "stream": [receipt["stream"] for receipt in receipts],
        "data": [receipt["datas"][0] for receipt in receipts],
        "note": [receipt["note"] for receipt in receipts],
        "recorded_at": now,
        "channels": receipts[0]["channels"],
    }


@dataclass
class _Waiting:
    request: EnqueueRequest
    admission: Admission | None
    future: asyncio.Future[EnqueueResult] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    span: trace.SpanContext = field(
        default_factory=lambda: trace.get_current_span().get_span_context()
    )

    def settle(self, outcome: Outcome) -> None:
        if self.future.done():  # its caller was cancelled: what was written stays written
            return
        if isinstance(outcome, Exception):
            self.future.set_exception(outcome)
        else:
            self.future.set_result(outcome)


class EnqueueBatcher:
    """Enqueue through a group commit of new jobs (this module's docstring): one per process,
    on one event loop."""

    def __init__(self, store: Store) -> None:
        self._store = store
        for reason in ("caps", "policy", "error"):  # at 0 from the start: alerts see the first
            metrics.ENQUEUE_BATCH_ALONE.labels(reason)
        self._waiting: list[_Waiting] = []
        self._busy = False
        self._flushing: asyncio.Task[None] | None = None

    async def enqueue(
        self, request: EnqueueRequest, admission: Admission | None = None
    ) -> EnqueueResult:
        """Enqueue `request` (receipts/enqueue.py `enqueue`); a new job may be written in one
        statement with the new jobs of other callers waiting meanwhile."""
        if not batchable(request):
            return await enqueue(self._store, request, admission)
        if not self._busy:
            self._busy = True
            metrics.ENQUEUE_BATCH.observe(1)
            try:
                return await enqueue_new(self._store, request, admission)
            finally:
                self._busy = False
                self._flush_waiting()
        waiting = _Waiting(request, admission)
        self._waiting.append(waiting)
        return await waiting.future

    def _flush_waiting(self) -> None:
        if self._waiting and not self._busy:
            self._busy = True
            # A context of its own: the flush is no part of the request that started it.
            self._flushing = asyncio.get_running_loop().create_task(
                self._flush(), name="enqueue-batch", context=contextvars.Context()
            )

    async def _flush(self) -> None:
        batch: list[_Waiting] = []
        try:
            while self._waiting:
                batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
                await self._write(batch)
                batch = []
        finally:
            # Cancelled (the loop is closing): no waiter is left without an answer. A batch
            # cancelled after its statement committed is answered so too, though written: its
            # ids were made up, so a retry is a new job, as after a reply lost alone.
            for waiting in (*batch, *self._waiting):
                waiting.settle(_stopped())
            self._waiting = []
            self._busy = False
            self._flushing = None

    async def _write(self, batch: list[_Waiting]) -> None:
        batch = [w for w in batch if not w.future.done()]  # a caller gone before: not written
        if not batch:
            return
        metrics.ENQUEUE_BATCH.observe(len(batch))
        # The batch's statements are spans of their own, linked from each caller's trace.
        links = [trace.Link(w.span) for w in batch if w.span.is_valid]
        with _tracer.start_as_current_span(
            "receipt.enqueue_batch", links=links, attributes={"receipt.jobs": len(batch)}
        ):
            outcomes: list[Outcome]
            try:
                outcomes = await enqueue_new_many(
                    self._store, [(w.request, w.admission) for w in batch]
                )
            except Exception as error:  # a bug of ours: every caller is answered with it
                outcomes = [error] * len(batch)
        for waiting, outcome in zip(batch, outcomes, strict=True):
            waiting.settle(outcome)
