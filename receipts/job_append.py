"""What one append to a job writes, decided in Python before any statement runs: the receipts
numbered from the job's head, the state they fold to, and the statement with its parameters.
Both ways of writing it use this plan — under the row lock of a transaction (`Tx.append_job`)
and as one guarded statement outside any (receipts/guarded.py) — so they write the same rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from receipts import jobs as jobmodel
from receipts import notices
from receipts.commands import with_unconsumed
from receipts.errors import InvariantError
from receipts.jobs import Job, Receipt
from receipts.projections import JOBS
from receipts.streams import Draft, dumps


@dataclass(frozen=True)
class JobAppend:
    """The plan of one append: `statement` (`append_job` or, for a plain heartbeat that only
    moves the lease, `append_job_heartbeat`) with `params`, the `receipts` it inserts and the
    state `folded` they make of `before`."""

    job_id: str
    before: Job | None
    drafts: list[Draft]
    receipts: list[Receipt]
    folded: Job
    statement: str
    params: dict[str, Any]

    @property
    def settled(self) -> bool:
        return self.folded.terminal and (self.before is None or not self.before.terminal)


def numbered(stream: str, head: int, drafts: Sequence[Draft], now: datetime) -> list[Receipt]:
    """The receipts `drafts` become on `stream` after seq `head`, recorded at `now`."""
    return [Receipt(stream, head + i, d.type, d.data, now) for i, d in enumerate(drafts, 1)]


def plan(
    job_id: str, job: Job | None, drafts: Sequence[Draft], now: datetime, *, owe_callbacks: bool
) -> JobAppend:
    """Fold `drafts` onto `job` at the database clock `now`. The reducer runs here, so a draft
    it would refuse raises `InvariantError` before anything is written. `owe_callbacks`: a
    settle leaves a `callback_outbox` row (only when a callback URL is configured)."""
    if not drafts:
        raise ValueError("append_job needs at least one receipt")
    # Commands the job ends without reading are settled with the receipt that ends it.
    all_drafts = with_unconsumed(job, drafts)
    receipts = numbered(jobmodel.job_stream(job_id), job.seq if job else 0, all_drafts, now)
    folded = jobmodel.fold(receipts, job)
    if folded is None:
        raise InvariantError(jobmodel.no_job_message(job_id))
    patch = jobmodel.lease_patch(job, folded)
    if patch is not None:
        # A plain heartbeat: the narrow lease row takes it; the jobs row and its indexes stay
        # as they are (docs/history.md).
        assert folded.lease is not None
        params: dict[str, Any] = {
            "job_id": job_id,
            "seq": folded.seq,
            "lease_expires_at": folded.lease.expires_at,
            "patch": Jsonb(patch, dumps=dumps),
        }
        return JobAppend(job_id, job, all_drafts, receipts, folded, "append_job_heartbeat", params)
    params = JOBS.row(folded)
    params["lease_ended"] = (
        job is not None
        and job.status in jobmodel.LEASED_STATUSES
        and folded.status not in jobmodel.LEASED_STATUSES
    )
    settled = folded.terminal and (job is None or not job.terminal)
    params["settled"] = settled
    params["owed"] = settled and owe_callbacks
    return JobAppend(job_id, job, all_drafts, receipts, folded, "append_job", params)


def insert_params(receipts: Sequence[Receipt], params: dict[str, Any]) -> dict[str, Any]:
    """An append statement's parameters: `params`, and the receipts of its one stream (types
    and data as binary text arrays) with the NOTIFY payload naming them and the channels it is
    sent on (receipts/notices.py)."""
    stream = receipts[0].stream
    types = [r.type for r in receipts]
    # The notice names each type once: a listener asks only whether a type is among them, and
    # PostgreSQL refuses a notice of 8 000 bytes or more ("payload string too long"), which
    # failed the whole append: one type per receipt, 330 receipts were too many (a control
    # pass recording the ends of two phases of tries, and every pass after it).
    named = list(dict.fromkeys(types))
    return {
        **params,
        "stream": stream,
        "seqs": [r.seq for r in receipts],
        "types": types,
        "datas": [dumps(r.data) for r in receipts],
        "note": dumps({"stream": stream, "seq": receipts[-1].seq, "types": named}),
        "channels": notices.channels(stream, types, takeover=any(map(_takes_over, receipts))),
    }


def _takes_over(receipt: Receipt) -> bool:
    """A start-fence heartbeat: a later delivery took the lease over (receipts/operations.py)."""
    return receipt.type == "job.heartbeat" and bool(receipt.data.get("startFence"))
