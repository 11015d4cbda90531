"""A fenced state change of a job in one round trip (receipts/sql/guarded.sql).

The writer reads the job with the database clock (one statement, or the worker's re-read before
its settle), decides under the fence, and the reducer folds the receipts in Python as always
(receipts/job_append.py). Instead of `BEGIN`, a row lock, the append and `COMMIT` — four round
trips — one statement applies the plan only if the job's stream head is still the one read and,
for a writer whose fence is a lease, that lease has not expired at the statement's clock. Nothing
is written otherwise, and the caller reads and decides again: the write lands on exactly the
state it was decided on, which is what the row lock guaranteed (docs/rules.md X8).

An append a settlement policy wants (the Factory's control outbox) writes other streams in the
same transaction, so it is not planned here: `NeedsTransaction` sends it to the locked path.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from receipts import metrics
from receipts.errors import ConflictError
from receipts.job_append import insert_params, plan
from receipts.jobs import Job, Receipt
from receipts.store import Store, Tx, translate_errors
from receipts.streams import Draft

log = logging.getLogger("receipts.guarded")


class NeedsTransaction(Exception):
    """A settlement policy wants this append: it must run under the row lock, in a transaction."""


async def append_if_unchanged(
    store: Store,
    job_id: str,
    job: Job,
    drafts: Sequence[Draft],
    now: datetime,
    *,
    lease_held: bool,
    session: Tx | None = None,
) -> tuple[Job, list[Receipt]] | None:
    """Append `drafts` to `job` as read at the database clock `now`, in one statement: applied
    only while the job's head is `job.seq` and, with `lease_held`, its lease is unexpired.

    Returns the new state and the receipts as stored, or None when the job changed (nothing was
    written). Raises `NeedsTransaction` when a settlement policy wants the append, and what the
    reducer raises for a draft it refuses. `session`: the connection the job was read on
    (`Store.session`), so the read and the write cost one checkout.
    """
    planned = plan(job_id, job, drafts, now, owe_callbacks=store.owe_callbacks)
    if any(p.wants(job, planned.folded, planned.drafts) for p in store.policies):
        raise NeedsTransaction(job_id)
    params = insert_params(
        planned.receipts,
        {
            **planned.params,
            "expected_seq": job.seq,
            "lease_held": lease_held,
            "recorded_at": now,
        },
    )
    try:
        with translate_errors():
            row = await (session or store).fetch_one(f"{planned.statement}_guarded", params)
    except ConflictError:
        # An append that committed after this statement's snapshot took the next seq.
        _refused(job_id, "conflict")
        return None
    if row is None or row[0] is None:
        _refused(job_id, "changed")
        return None
    stored = [replace(r, position=p) for r, p in zip(planned.receipts, row[0], strict=True)]
    return planned.folded, stored


def _refused(job_id: str, reason: str) -> None:
    metrics.GUARDED_REFUSALS.labels(reason).inc()
    log.debug(
        "guarded append refused: the job changed since it was read",
        extra={"event": "job.guarded_refused", "jobId": job_id, "reason": reason},
    )
