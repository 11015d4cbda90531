"""Audit a job's receipt chain alone: terminal count, writes after settlement, stale fences.

Pure: it folds the chain with the reducer and checks every fenced write against the state it
was appended to. The fenced operations never write a rejected receipt, so any receipt the
reducer had to ignore is a defect this audit reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from receipts import jobs as jobmodel
from receipts.jobs import Job, Receipt

FENCED_TYPES = frozenset(
    {"job.heartbeat", "job.progress", "job.completed", "job.failed", "queue.command.consumed"}
)


@dataclass
class ChainAudit:
    """What the audit of one job's chain found."""

    job_id: str
    job: Job | None = None
    terminal_transitions: int = 0
    after_terminal: list[int] = field(default_factory=list)
    stale_fence_writes: list[int] = field(default_factory=list)
    gaps: list[int] = field(default_factory=list)

    @property
    def final_status(self) -> str | None:
        """The folded status at the end of the chain."""
        return self.job.status if self.job else None

    @property
    def clean(self) -> bool:
        """One terminal transition at most, nothing after it, no stale fence, no seq gap."""
        return (
            self.terminal_transitions <= 1
            and not self.after_terminal
            and not self.stale_fence_writes
            and not self.gaps
        )


def _fence_held(job: Job, receipt: Receipt) -> bool:
    """True when the fenced `receipt` was written by the lease active at that point."""
    data = receipt.data
    if receipt.type == "job.heartbeat" and data.get("startFence"):
        return job.lease is not None and job.lease.attempt == data.get("attempt")
    return jobmodel.fence_matches(job, data.get("workerId"), data.get("attempt"))


def audit_chain(job_id: str, receipts: Sequence[Receipt]) -> ChainAudit:
    """Fold `receipts` (one stream, in seq order) and report what is wrong with the chain."""
    audit = ChainAudit(job_id)
    job: Job | None = None
    for expected_seq, receipt in enumerate(receipts, start=1):
        if receipt.seq != expected_seq:
            audit.gaps.append(receipt.seq)
        if job is not None and job.terminal:
            audit.after_terminal.append(receipt.seq)
        elif job is not None and receipt.type in FENCED_TYPES and not _fence_held(job, receipt):
            audit.stale_fence_writes.append(receipt.seq)
        before = job.terminal if job else False
        job = jobmodel.apply(job, receipt)
        if job is not None and job.terminal and not before:
            audit.terminal_transitions += 1
    audit.job = job
    return audit
