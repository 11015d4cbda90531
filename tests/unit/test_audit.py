"""The chain audit (pure): terminal count, writes after settlement, stale fences, seq gaps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from receipts.audit import audit_chain
from receipts.jobs import Receipt

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ENQUEUED = {
    "jobId": "j",
    "agentId": "codex",
    "lane": "collect",
    "kind": "factory.task.run",
    "payload": {},
    "maxAttempts": 2,
}


def chain(*events: tuple[str, dict[str, Any]]) -> list[Receipt]:
    return [
        Receipt("jobs/j", i, t, d, T0 + timedelta(seconds=i))
        for i, (t, d) in enumerate(events, start=1)
    ]


LEASE = ("job.leased", {"workerId": "a", "attempt": 1, "expiresAt": "2027-01-01T00:00:00+00:00"})


def test_a_clean_chain_has_one_terminal_transition() -> None:
    audit = audit_chain(
        "j",
        chain(
            ("job.enqueued", ENQUEUED),
            LEASE,
            ("job.heartbeat", {"workerId": "a", "attempt": 1}),
            ("job.completed", {"workerId": "a", "attempt": 1}),
        ),
    )
    assert audit.clean and audit.terminal_transitions == 1 and audit.final_status == "completed"


def test_a_write_after_the_terminal_receipt_is_reported() -> None:
    audit = audit_chain(
        "j",
        chain(
            ("job.enqueued", ENQUEUED),
            LEASE,
            ("job.completed", {"workerId": "a", "attempt": 1}),
            ("job.completed", {"workerId": "a", "attempt": 1}),
        ),
    )
    assert audit.after_terminal == [4] and not audit.clean


def test_a_write_from_a_superseded_fence_is_reported() -> None:
    audit = audit_chain(
        "j",
        chain(
            ("job.enqueued", ENQUEUED),
            LEASE,
            ("job.heartbeat", {"workerId": "b", "attempt": 1, "startFence": True}),
            ("job.progress", {"workerId": "a", "attempt": 1, "data": 1}),
            ("job.completed", {"workerId": "b", "attempt": 1}),
        ),
    )
    assert audit.stale_fence_writes == [4]
    assert audit.terminal_transitions == 1 and not audit.clean


def test_a_seq_gap_is_reported() -> None:
    receipts = chain(("job.enqueued", ENQUEUED), LEASE)
    receipts[1] = Receipt("jobs/j", 3, receipts[1].type, receipts[1].data, T0)
    assert audit_chain("j", receipts).gaps == [3]


def test_a_failed_by_lease_expiry_job_is_terminal_once() -> None:
    expired = ("job.lease_expired", {"workerId": "a", "attempt": 1})
    enqueued = {**ENQUEUED, "maxAttempts": 1}
    audit = audit_chain("j", chain(("job.enqueued", enqueued), LEASE, expired))
    assert audit.clean and audit.final_status == "failed" and audit.terminal_transitions == 1
