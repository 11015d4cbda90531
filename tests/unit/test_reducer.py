"""Table tests of the job reducer against the spec's "Lifecycle receipts" section and docs/design.md §4.

Also covers the pure fence check (`receipts.operations.fence_rejection`), payload kinds, their
contracts and routing (`receipts.kinds`, docs/design.md §5), and enqueue parsing
(`receipts.enqueue.parse_enqueue`).

Each reducer table row is: a history (receipts folded into the starting state), one more
receipt, and either the fields that receipt must produce or `INERT` (nothing but `seq` moves).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from receipts import jobs, operations
from receipts.enqueue import parse_enqueue
from receipts.errors import InvalidInput, InvariantError
from receipts.jobs import RECEIPT_TYPES, Job, Receipt, apply, fold, job_stream
from receipts.kinds import CONTRACTS, KINDS, route, route_disagrees, validate_payload
from receipts.operations import fence_rejection

JOB_ID = "job-1"
STREAM = job_stream(JOB_ID)
T0 = datetime(2025, 1, 1, tzinfo=UTC)
LEASE_EXPIRES = T0 + timedelta(hours=1)
HEARTBEAT_EXPIRES = T0 + timedelta(hours=2)

# Deliveries: `<jobId>:attempt:<n>/<k>` (docs/design.md §4).
W1 = f"{JOB_ID}:attempt:1/1"
W1B = f"{JOB_ID}:attempt:1/2"  # a redelivery of attempt 1 (start fence)
W2 = f"{JOB_ID}:attempt:2/1"

SPEC_STATUSES = ("queued", "leased", "running", "completed", "failed", "canceled")
SPEC_RECEIPT_TYPES = (
    "job.enqueued",
    "job.leased",
    "job.heartbeat",
    "job.progress",
    "job.completed",
    "job.failed",
    "job.canceled",
    "queue.command",
    "queue.command.consumed",
    "job.lease_expired",
)
SPEC_RESULT_STATUSES = (
    "settlement_conflict",
    "stale_attempt",
    "lease_lost",
    "terminal_state",
    "canceled",
    "execution_timeout",
    "failed",
)

Event = tuple[str, Mapping[str, Any]]
INERT: dict[str, Any] = {}  # marker: the receipt changes nothing but `seq`


# --------------------------------------------------------------------------------------------
# Receipt builders
# --------------------------------------------------------------------------------------------


def at(seq: int) -> datetime:
    return T0 + timedelta(seconds=seq)


def enqueued(**overrides: Any) -> Event:
    data: dict[str, Any] = {
        "jobId": JOB_ID,
        "agentId": "factory",
        "lane": "collect",
        "kind": "factory.dispatch",
        "payload": {
            "kind": "factory.dispatch",
            "authContext": {"userId": "user-1", "organizationId": "org-1"},
        },
        "organizationId": "org-1",
        "sessionKey": "session-1",
        "singletonMode": "allow",
        "maxAttempts": 2,
    }
    data.update(overrides)
    return ("job.enqueued", data)


def leased(worker: str | None, attempt: int | None) -> Event:
    data = {"workerId": worker, "attempt": attempt, "expiresAt": LEASE_EXPIRES.isoformat()}
    return ("job.leased", data)


def heartbeat(worker: str | None, attempt: int | None, *, start_fence: bool = False) -> Event:
    data: dict[str, Any] = {
        "workerId": worker,
        "attempt": attempt,
        "expiresAt": HEARTBEAT_EXPIRES.isoformat(),
    }
    if start_fence:
        data["startFence"] = True
    return ("job.heartbeat", data)


def progress(worker: str | None, attempt: int | None, data: Any = None) -> Event:
    body = {"pct": 50} if data is None else data
    return ("job.progress", {"workerId": worker, "attempt": attempt, "data": body})


def completed(worker: str | None, attempt: int | None, result: Any = None) -> Event:
    data = {
        "workerId": worker,
        "attempt": attempt,
        "settlementId": worker,
        "result": {"ok": True} if result is None else result,
    }
    return ("job.completed", data)


def failed(
    worker: str | None,
    attempt: int | None,
    *,
    retryable: bool,
    status: str | None = None,
    refund: bool = False,
    error: str = "boom",
    result: Any = None,
) -> Event:
    data: dict[str, Any] = {
        "workerId": worker,
        "attempt": attempt,
        "settlementId": worker,
        "error": error,
        "retryable": retryable,
    }
    if status is not None:
        data["status"] = status
    if refund:
        data["refundAttempt"] = True
    if result is not None:
        data["result"] = result
    return ("job.failed", data)


def canceled(
    worker: str | None = None, attempt: int | None = None, reason: str = "singleton cancel"
) -> Event:
    data = {"workerId": worker, "attempt": attempt, "settlementId": worker, "reason": reason}
    if worker is None:
        data = {"reason": reason, "attempt": attempt}
    return ("job.canceled", data)


def command(command_id: str, type: str, reason: str | None = None, **extra: Any) -> Event:
    data: dict[str, Any] = {
        "commandId": command_id,
        "type": type,
        "lane": None if type == "abort" else type,
        "payload": None if type == "abort" else {"text": f"{type} {command_id}"},
        "reason": reason,
    }
    data.update(extra)
    return ("queue.command", data)


def consumed(command_id: str, worker: str | None, attempt: int | None) -> Event:
    data = {"commandId": command_id, "attempt": attempt, "workerId": worker}
    return ("queue.command.consumed", data)


def lease_expired(worker: str | None, attempt: int | None) -> Event:
    data = {"workerId": worker, "attempt": attempt, "expiresAt": LEASE_EXPIRES.isoformat()}
    return ("job.lease_expired", data)


def receipts(events: Sequence[Event], stream: str = STREAM, start: int = 1) -> list[Receipt]:
    return [
        Receipt(stream, start + i, kind, dict(data), at(start + i))
        for i, (kind, data) in enumerate(events)
    ]


def state(events: Sequence[Event]) -> Job:
    job = fold(receipts(events))
    assert job is not None
    return job


def step(history: Sequence[Event], event: Event) -> tuple[Job, Job]:
    """Fold `history`, then apply `event` as the next receipt; return (before, after)."""
    before = state(history)
    seq = before.seq + 1
    after = apply(before, Receipt(STREAM, seq, event[0], dict(event[1]), at(seq)))
    assert after is not None
    return before, after


def view(job: Job) -> dict[str, Any]:
    """A flat view of the fields the tables talk about."""
    return {
        "status": job.status,
        "attempt": job.attempt,
        "worker": job.lease.worker_id if job.lease else None,
        "leaseAttempt": job.lease.attempt if job.lease else None,
        "expiresAt": job.lease.expires_at if job.lease else None,
        "lastHeartbeatAt": job.last_heartbeat_at,
        "error": job.error,
        "result": job.result,
        "settlementId": job.settlement_id,
        "settled": job.settled_at is not None,
        "canceledReason": job.canceled_reason,
        "abortRequested": job.abort_requested,
        "abortReason": job.abort_reason,
        "commands": [c.command_id for c in job.commands],
        "pending": [c.command_id for c in job.pending_commands],
        "progress": job.progress,
        "progressCount": job.progress_count,
    }


def check(history: Sequence[Event], event: Event, expected: Mapping[str, Any]) -> Job:
    before, after = step(history, event)
    assert after.seq == before.seq + 1
    if not expected:
        assert after == before.model_copy(update={"seq": after.seq}), "receipt must be inert"
        return after
    got = view(after)
    assert {k: got[k] for k in expected} == dict(expected)
    assert after.updated_at == at(after.seq)
    return after


# --------------------------------------------------------------------------------------------
# Histories (starting states)
# --------------------------------------------------------------------------------------------

QUEUED = [enqueued()]
LEASED = [*QUEUED, leased(W1, 1)]
RUNNING = [*LEASED, heartbeat(W1, 1)]
# attempt 1 failed retryably: queued again, attempt 1 of 2
REQUEUED = [*RUNNING, failed(W1, 1, retryable=True)]
# attempt 2 of 2, running under W2
RUNNING_2 = [*REQUEUED, leased(W2, 2), heartbeat(W2, 2)]
# a redelivery of attempt 1 took the start fence: the lease is now W1B's
REBOUND = [*RUNNING, heartbeat(W1B, 1, start_fence=True)]
COMPLETED = [*RUNNING, completed(W1, 1)]
FAILED = [*RUNNING, failed(W1, 1, retryable=False, status="failed")]
CANCELED = [*QUEUED, canceled(reason="user")]
EXPIRED_OUT = [*RUNNING_2, lease_expired(W2, 2)]
# a steer consumed by attempt 1, which is still running
STEER_CONSUMED = [*RUNNING, command("c1", "steer"), consumed("c1", W1, 1)]

HISTORIES = {
    "queued": QUEUED,
    "leased": LEASED,
    "running": RUNNING,
    "requeued": REQUEUED,
    "running_2": RUNNING_2,
    "rebound": REBOUND,
    "completed": COMPLETED,
    "failed": FAILED,
    "canceled": CANCELED,
    "expired_out": EXPIRED_OUT,
}
TERMINAL_HISTORIES = ("completed", "failed", "canceled", "expired_out")


def test_histories_are_in_the_states_their_names_say() -> None:
    expected = {
        "queued": ("queued", 0, None),
        "leased": ("leased", 1, W1),
        "running": ("running", 1, W1),
        "requeued": ("queued", 1, None),
        "running_2": ("running", 2, W2),
        "rebound": ("running", 1, W1B),
        "completed": ("completed", 1, None),
        "failed": ("failed", 1, None),
        "canceled": ("canceled", 0, None),
        "expired_out": ("failed", 2, None),
    }
    for name, history in HISTORIES.items():
        job = state(history)
        assert (job.status, job.attempt, view(job)["worker"]) == expected[name], name


def test_vocabularies_are_the_spec_ones() -> None:
    assert jobs.STATUSES == SPEC_STATUSES
    assert jobs.RECEIPT_TYPES == SPEC_RECEIPT_TYPES
    assert jobs.LANES == ("chat", "collect", "steer", "follow_up")
    assert jobs.DEFAULT_LANE == "collect"
    assert jobs.COMMAND_TYPES == ("steer", "follow_up", "abort")
    assert jobs.COMMAND_LANES == ("steer", "follow_up")
    assert jobs.SINGLETON_MODES == ("allow", "cancel", "steer")
    assert jobs.DEFAULT_MAX_ATTEMPTS == 2
    assert (jobs.MIN_ATTEMPTS, jobs.MAX_ATTEMPTS) == (1, 8)
    assert jobs.SINGLETON_CANCEL_REASON == "singleton cancel"
    assert jobs.TERMINAL_STATUSES == {"completed", "failed", "canceled"}


def test_the_attempt_result_statuses_are_the_spec_seven() -> None:
    from receipts.messages import ATTEMPT_STATUSES

    assert ATTEMPT_STATUSES == SPEC_RESULT_STATUSES


def test_exactly_four_agent_ids_have_built_in_handlers() -> None:
    from activities.handlers.registry import default_handlers
    from receipts.kinds import AGENT_IDS

    assert AGENT_IDS == ("factory", "factory-control", "factory-monitor", "codex")
    assert set(default_handlers()) == set(AGENT_IDS)


# --------------------------------------------------------------------------------------------
# job.enqueued
# --------------------------------------------------------------------------------------------


def test_enqueued_creates_a_queued_job_from_its_data() -> None:
    job = state(
        [
            enqueued(
                lane="chat",
                agentId="codex",
                kind="factory.task.run",
                sessionKey="s-9",
                singletonMode="steer",
                maxAttempts=5,
                organizationId="org-7",
            )
        ]
    )
    assert job.job_id == JOB_ID
    assert job.agent_id == "codex"
    assert job.lane == "chat"
    assert job.kind == "factory.task.run"
    assert job.payload["kind"] == "factory.dispatch"
    assert job.organization_id == "org-7"
    assert job.session_key == "s-9"
    assert job.singleton_mode == "steer"
    assert job.max_attempts == 5
    assert job.status == "queued"
    assert job.attempt == 0
    assert job.lease is None
    assert job.commands == ()
    assert job.abort_requested is False
    assert job.created_at == job.updated_at == at(1)
    assert job.seq == 1
    assert job.terminal is False


@pytest.mark.parametrize("name", list(HISTORIES))
def test_a_second_enqueued_changes_nothing(name: str) -> None:
    check(HISTORIES[name], enqueued(agentId="other", maxAttempts=8), INERT)


# --------------------------------------------------------------------------------------------
# "An event for a job that does not exist throws `Invariant: no job for <jobId>`"
# --------------------------------------------------------------------------------------------

SAMPLE_EVENTS: dict[str, Event] = {
    "job.enqueued": enqueued(),
    "job.leased": leased(W1, 1),
    "job.heartbeat": heartbeat(W1, 1),
    "job.progress": progress(W1, 1),
    "job.completed": completed(W1, 1),
    "job.failed": failed(W1, 1, retryable=True),
    "job.canceled": canceled(),
    "queue.command": command("c1", "steer"),
    "queue.command.consumed": consumed("c1", W1, 1),
    "job.lease_expired": lease_expired(W1, 1),
}
IGNORED_ON_MISSING = ("job.failed", "job.lease_expired")
FATAL_ON_MISSING = [t for t in SPEC_RECEIPT_TYPES if t not in ("job.enqueued", *IGNORED_ON_MISSING)]


def test_sample_events_cover_every_receipt_type() -> None:
    assert tuple(SAMPLE_EVENTS) == RECEIPT_TYPES
    assert len(FATAL_ON_MISSING) == 7


@pytest.mark.parametrize("job_id", [JOB_ID, "0b9e7c1e-5a3f-4a55-9d53-1f0e2b5e9a10"])
@pytest.mark.parametrize("kind", FATAL_ON_MISSING)
def test_event_for_a_missing_job_raises_the_exact_invariant(kind: str, job_id: str) -> None:
    receipt = Receipt(job_stream(job_id), 1, kind, dict(SAMPLE_EVENTS[kind][1]), at(1))
    with pytest.raises(InvariantError) as raised:
        apply(None, receipt)
    assert str(raised.value) == f"Invariant: no job for {job_id}"
    assert jobs.no_job_message(job_id) == f"Invariant: no job for {job_id}"


@pytest.mark.parametrize("kind", IGNORED_ON_MISSING)
def test_failed_and_lease_expired_for_a_missing_job_are_ignored(kind: str) -> None:
    receipt = Receipt(STREAM, 1, kind, dict(SAMPLE_EVENTS[kind][1]), at(1))
    assert apply(None, receipt) is None


def test_failed_with_no_fence_for_a_missing_job_is_ignored() -> None:
    assert apply(None, receipts([failed(None, None, retryable=False)])[0]) is None


def test_ignored_late_settlements_do_not_break_a_fold() -> None:
    assert fold(receipts([failed(W1, 1, retryable=False), lease_expired(W1, 1)])) is None
    job = fold(receipts([failed(W1, 1, retryable=True), lease_expired(W1, 1), *LEASED]))
    assert job is not None
    assert (job.status, job.attempt, job.seq) == ("leased", 1, 4)


def test_fold_raises_at_the_first_fatal_event_after_ignored_ones() -> None:
    with pytest.raises(InvariantError, match=r"^Invariant: no job for job-1$"):
        fold(receipts([lease_expired(W1, 1), failed(W1, 1, retryable=True), heartbeat(W1, 1)]))


def test_fold_of_nothing_is_nothing() -> None:
    assert fold([]) is None


# --------------------------------------------------------------------------------------------
# "job.leased is ignored unless the job is currently queued"
# --------------------------------------------------------------------------------------------

LEASE_TABLE = [
    pytest.param(
        QUEUED,
        leased(W1, 1),
        {
            "status": "leased",
            "attempt": 1,
            "worker": W1,
            "leaseAttempt": 1,
            "expiresAt": LEASE_EXPIRES,
            "lastHeartbeatAt": at(2),
        },
        id="queued-leased-attempt-1",
    ),
    pytest.param(
        REQUEUED,
        leased(W2, 2),
        {"status": "leased", "attempt": 2, "worker": W2, "leaseAttempt": 2},
        id="requeued-leased-attempt-2",
    ),
    pytest.param(
        [*RUNNING, lease_expired(W1, 1)],
        leased(W2, 2),
        {"status": "leased", "attempt": 2, "worker": W2},
        id="expired-requeued-leased-attempt-2",
    ),
    pytest.param(LEASED, leased(W1B, 2), INERT, id="second-lease-on-leased-other-worker"),
    pytest.param(LEASED, leased(W1, 1), INERT, id="second-lease-on-leased-same-fence"),
    pytest.param(RUNNING, leased(W2, 2), INERT, id="lease-on-running"),
    pytest.param(REBOUND, leased(W2, 2), INERT, id="lease-on-rebound-running"),
    *[
        pytest.param(HISTORIES[name], leased(W2, 2), INERT, id=f"lease-on-{name}")
        for name in TERMINAL_HISTORIES
    ],
]


@pytest.mark.parametrize(("history", "event", "expected"), LEASE_TABLE)
def test_leased(history: list[Event], event: Event, expected: dict[str, Any]) -> None:
    check(history, event, expected)


def test_second_lease_on_an_already_leased_job_changes_nothing() -> None:
    first = state(LEASED)
    second = fold(receipts([leased(W2, 2)], start=3), first)
    assert second is not None
    assert second.lease == first.lease
    assert second.attempt == 1
    assert second.model_copy(update={"seq": first.seq}) == first


# --------------------------------------------------------------------------------------------
# "job.heartbeat promotes leased to running, but only when the heartbeat's worker id and attempt
# match the active lease. A heartbeat from a superseded attempt is inert."
# --------------------------------------------------------------------------------------------

HEARTBEAT_TABLE = [
    pytest.param(
        LEASED,
        heartbeat(W1, 1),
        {
            "status": "running",
            "attempt": 1,
            "worker": W1,
            "expiresAt": HEARTBEAT_EXPIRES,
            "lastHeartbeatAt": at(3),
        },
        id="leased-promoted-to-running",
    ),
    pytest.param(
        RUNNING,
        heartbeat(W1, 1),
        {"status": "running", "worker": W1, "lastHeartbeatAt": at(4)},
        id="running-renewed",
    ),
    pytest.param(
        RUNNING_2, heartbeat(W2, 2), {"status": "running", "worker": W2}, id="attempt-2-renewed"
    ),
    pytest.param(LEASED, heartbeat(W1B, 1), INERT, id="other-worker-same-attempt"),
    pytest.param(LEASED, heartbeat(W1, 2), INERT, id="same-worker-other-attempt"),
    pytest.param(LEASED, heartbeat(W1, 0), INERT, id="same-worker-older-attempt"),
    pytest.param(LEASED, heartbeat(None, 1), INERT, id="no-worker"),
    pytest.param(LEASED, heartbeat(W1, None), INERT, id="no-attempt"),
    pytest.param(RUNNING, heartbeat(W2, 2), INERT, id="running-future-attempt"),
    pytest.param(QUEUED, heartbeat(None, 0), INERT, id="queued-system-fence"),
    pytest.param(QUEUED, heartbeat(W1, 1), INERT, id="queued-would-be-lease"),
    pytest.param(REQUEUED, heartbeat(W1, 1), INERT, id="requeued-old-worker"),
    pytest.param(RUNNING_2, heartbeat(W1, 1), INERT, id="superseded-attempt"),
    pytest.param(RUNNING_2, heartbeat(W1, 2), INERT, id="superseded-worker-current-attempt"),
]


@pytest.mark.parametrize(("history", "event", "expected"), HEARTBEAT_TABLE)
def test_heartbeat(history: list[Event], event: Event, expected: dict[str, Any]) -> None:
    check(history, event, expected)


# --------------------------------------------------------------------------------------------
# Start-fence heartbeat (docs/design.md §4): matches on attempt alone and rebinds the lease's workerId;
# for any other attempt it is inert.
# --------------------------------------------------------------------------------------------

START_FENCE_TABLE = [
    pytest.param(
        LEASED,
        heartbeat(W1B, 1, start_fence=True),
        {
            "status": "running",
            "attempt": 1,
            "worker": W1B,
            "leaseAttempt": 1,
            "expiresAt": HEARTBEAT_EXPIRES,
        },
        id="leased-rebound-and-promoted",
    ),
    pytest.param(
        RUNNING,
        heartbeat(W1B, 1, start_fence=True),
        {"status": "running", "worker": W1B, "leaseAttempt": 1},
        id="running-rebound",
    ),
    pytest.param(
        RUNNING,
        heartbeat(W1, 1, start_fence=True),
        {"status": "running", "worker": W1},
        id="same-delivery-renews",
    ),
    pytest.param(
        REBOUND,
        heartbeat(W1, 1, start_fence=True),
        {"status": "running", "worker": W1},
        id="rebound-back-by-another-start-fence",
    ),
    pytest.param(
        RUNNING_2,
        heartbeat("elsewhere", 2, start_fence=True),
        {"worker": "elsewhere", "leaseAttempt": 2},
        id="attempt-2-rebound",
    ),
    pytest.param(RUNNING, heartbeat(W2, 2, start_fence=True), INERT, id="future-attempt"),
    pytest.param(RUNNING, heartbeat(W1B, 0, start_fence=True), INERT, id="older-attempt"),
    pytest.param(RUNNING, heartbeat(W1B, None, start_fence=True), INERT, id="no-attempt"),
    pytest.param(RUNNING, heartbeat(None, 1, start_fence=True), INERT, id="no-worker"),
    pytest.param(RUNNING_2, heartbeat(W1B, 1, start_fence=True), INERT, id="superseded"),
    pytest.param(QUEUED, heartbeat(W1, 0, start_fence=True), INERT, id="queued-no-lease"),
    pytest.param(QUEUED, heartbeat(W1, 1, start_fence=True), INERT, id="queued-next-attempt"),
    pytest.param(REQUEUED, heartbeat(W1B, 1, start_fence=True), INERT, id="requeued-no-lease"),
]


@pytest.mark.parametrize(("history", "event", "expected"), START_FENCE_TABLE)
def test_start_fence_heartbeat(
    history: list[Event], event: Event, expected: dict[str, Any]
) -> None:
    check(history, event, expected)


# After the rebind, the earlier delivery (W1) of the same attempt is shut out: each of its
# writes is inert, while the same write from the new delivery (W1B) applies.
REBIND_PAIRS = [
    pytest.param(lambda w: heartbeat(w, 1), {"status": "running"}, id="heartbeat"),
    pytest.param(lambda w: progress(w, 1), {"progressCount": 1}, id="progress"),
    pytest.param(lambda w: completed(w, 1), {"status": "completed"}, id="completed"),
    pytest.param(
        lambda w: failed(w, 1, retryable=True), {"status": "queued"}, id="failed-retryable"
    ),
    pytest.param(
        lambda w: failed(w, 1, retryable=False, status="lease_lost"),
        {"status": "failed"},
        id="failed-final",
    ),
    pytest.param(lambda w: canceled(w, 1, reason="abort"), {"status": "canceled"}, id="canceled"),
    pytest.param(lambda w: lease_expired(w, 1), {"status": "queued"}, id="lease-expired"),
    pytest.param(lambda w: consumed("c1", w, 1), {"pending": []}, id="command-consumed"),
]


@pytest.mark.parametrize(("make", "effect"), REBIND_PAIRS)
def test_after_start_fence_the_old_delivery_is_inert(make: Any, effect: dict[str, Any]) -> None:
    history = [*RUNNING, command("c1", "steer"), heartbeat(W1B, 1, start_fence=True)]
    check(history, make(W1), INERT)
    check(history, make(W1B), effect)


def test_stale_delivery_cannot_settle_after_start_fence_sequence() -> None:
    job = state(
        [
            *LEASED,
            heartbeat(W1, 1),
            heartbeat(W1B, 1, start_fence=True),
            progress(W1, 1),
            heartbeat(W1, 1),
            completed(W1, 1, result={"from": "old"}),
            failed(W1, 1, retryable=False, status="failed"),
            completed(W1B, 1, result={"from": "new"}),
        ]
    )
    assert job.status == "completed"
    assert job.result == {"from": "new"}
    assert job.settlement_id == W1B
    assert job.progress_count == 0


# --------------------------------------------------------------------------------------------
# job.progress — "the same active-lease check"
# --------------------------------------------------------------------------------------------

PROGRESS_TABLE = [
    pytest.param(
        RUNNING,
        progress(W1, 1, {"pct": 10}),
        {"status": "running", "progress": {"pct": 10}, "progressCount": 1},
        id="running",
    ),
    pytest.param(
        LEASED,
        progress(W1, 1, {"pct": 1}),
        {"status": "leased", "progress": {"pct": 1}, "progressCount": 1},
        id="leased-not-promoted",
    ),
    pytest.param(
        [*RUNNING, progress(W1, 1, {"pct": 10})],
        progress(W1, 1, {"pct": 20}),
        {"progress": {"pct": 20}, "progressCount": 2},
        id="second-progress",
    ),
    pytest.param(RUNNING, progress(W1B, 1), INERT, id="other-worker"),
    pytest.param(RUNNING, progress(W1, 2), INERT, id="other-attempt"),
    pytest.param(RUNNING, progress(None, 1), INERT, id="no-worker"),
    pytest.param(QUEUED, progress(None, 0), INERT, id="queued-system-fence"),
    pytest.param(REQUEUED, progress(W1, 1), INERT, id="requeued-old-worker"),
    pytest.param(RUNNING_2, progress(W1, 1), INERT, id="superseded-attempt"),
]


@pytest.mark.parametrize(("history", "event", "expected"), PROGRESS_TABLE)
def test_progress(history: list[Event], event: Event, expected: dict[str, Any]) -> None:
    check(history, event, expected)


# --------------------------------------------------------------------------------------------
# job.completed — "the same active-lease check"
# --------------------------------------------------------------------------------------------

COMPLETED_TABLE = [
    pytest.param(
        RUNNING,
        completed(W1, 1, result={"answer": 42}),
        {
            "status": "completed",
            "result": {"answer": 42},
            "settlementId": W1,
            "worker": None,
            "settled": True,
            "attempt": 1,
        },
        id="running",
    ),
    pytest.param(LEASED, completed(W1, 1), {"status": "completed"}, id="leased-no-heartbeat"),
    pytest.param(
        RUNNING_2, completed(W2, 2), {"status": "completed", "attempt": 2}, id="attempt-2"
    ),
    pytest.param(RUNNING, completed(W1B, 1), INERT, id="other-worker"),
    pytest.param(RUNNING, completed(W1, 2), INERT, id="other-attempt"),
    pytest.param(RUNNING, completed(None, 1), INERT, id="no-worker"),
    pytest.param(QUEUED, completed(None, 0), INERT, id="queued-system-fence"),
    pytest.param(REQUEUED, completed(W1, 1), INERT, id="requeued-old-worker"),
    pytest.param(RUNNING_2, completed(W1, 1), INERT, id="superseded-attempt"),
]


@pytest.mark.parametrize(("history", "event", "expected"), COMPLETED_TABLE)
def test_completed(history: list[Event], event: Event, expected: dict[str, Any]) -> None:
    check(history, event, expected)


# --------------------------------------------------------------------------------------------
# job.failed — retryable/attempts/refund/status, system failure, same active-lease check
# --------------------------------------------------------------------------------------------

FAILED_TABLE = [
    pytest.param(
        RUNNING,
        failed(W1, 1, retryable=True, error="handler crashed"),
        {
            "status": "queued",
            "attempt": 1,
            "worker": None,
            "leaseAttempt": None,
            "error": "handler crashed",
            "result": None,
            "settled": False,
        },
        id="retryable-attempts-left-requeued",
    ),
    pytest.param(
        STEER_CONSUMED,
        failed(W1, 1, retryable=True),
        {"status": "queued", "commands": ["c1"], "pending": ["c1"]},
        id="retryable-requeue-makes-consumed-commands-pending",
    ),
    pytest.param(
        RUNNING_2,
        failed(W2, 2, retryable=True, status="execution_timeout", error="timed out"),
        {
            "status": "failed",
            "attempt": 2,
            "worker": None,
            "error": "timed out",
            "result": None,
            "settled": True,
        },
        id="retryable-exhausted-failed-no-status",
    ),
    pytest.param(
        RUNNING_2,
        failed(W2, 2, retryable=True, status="execution_timeout", result={"partial": 1}),
        {"status": "failed", "result": {"partial": 1}},
        id="retryable-exhausted-result-without-status",
    ),
    pytest.param(
        [enqueued(maxAttempts=1), leased(W1, 1), heartbeat(W1, 1)],
        failed(W1, 1, retryable=True),
        {"status": "failed", "attempt": 1, "settled": True},
        id="retryable-max-attempts-1",
    ),
    pytest.param(
        RUNNING,
        failed(W1, 1, retryable=False, status="lease_lost", error="lost"),
        {
            "status": "failed",
            "attempt": 1,
            "error": "lost",
            "result": {"status": "lease_lost"},
            "settlementId": W1,
            "settled": True,
        },
        id="non-retryable-attempts-left-still-failed-status-copied",
    ),
    pytest.param(
        RUNNING,
        failed(W1, 1, retryable=False, status="failed", result={"detail": "x"}),
        {"status": "failed", "result": {"detail": "x", "status": "failed"}},
        id="non-retryable-status-merged-into-result",
    ),
    pytest.param(
        RUNNING,
        failed(W1, 1, retryable=False),
        {"status": "failed", "result": None},
        id="non-retryable-without-status",
    ),
    pytest.param(
        RUNNING,
        failed(W1, 1, retryable=True, refund=True, error="worker shutdown"),
        {"status": "queued", "attempt": 0, "worker": None, "error": "worker shutdown"},
        id="refund-first-attempt",
    ),
    pytest.param(
        RUNNING_2,
        failed(W2, 2, retryable=True, refund=True, error="worker shutdown"),
        {"status": "queued", "attempt": 1, "worker": None, "settled": False},
        id="refund-at-last-attempt",
    ),
    pytest.param(
        [*STEER_CONSUMED],
        failed(W1, 1, retryable=True, refund=True, error="worker shutdown"),
        {"status": "queued", "attempt": 0, "pending": ["c1"]},
        id="refund-makes-consumed-commands-pending",
    ),
    pytest.param(
        QUEUED,
        failed(None, 0, retryable=True, refund=True),
        {"status": "queued", "attempt": 0},
        id="refund-never-takes-attempt-below-0",
    ),
    pytest.param(
        QUEUED,
        failed(None, 0, retryable=False, error="resonate delivery recovery exceeded 32"),
        {
            "status": "failed",
            "attempt": 0,
            "error": "resonate delivery recovery exceeded 32",
            "settled": True,
        },
        id="system-failure-queued-attempt-0",
    ),
    pytest.param(
        REQUEUED,
        failed(None, 1, retryable=False, error="system"),
        {"status": "failed", "attempt": 1, "error": "system"},
        id="system-failure-requeued-attempt-1",
    ),
    pytest.param(RUNNING, failed(W1B, 1, retryable=True), INERT, id="other-worker"),
    pytest.param(RUNNING, failed(W1, 2, retryable=False), INERT, id="other-attempt"),
    pytest.param(RUNNING, failed(None, 1, retryable=False), INERT, id="running-without-worker"),
    pytest.param(LEASED, failed(None, 1, retryable=False), INERT, id="leased-without-worker"),
    pytest.param(QUEUED, failed(None, 1, retryable=False), INERT, id="system-wrong-attempt"),
    pytest.param(QUEUED, failed(W1, 0, retryable=False), INERT, id="queued-with-worker"),
    pytest.param(REQUEUED, failed(W1, 1, retryable=False), INERT, id="requeued-old-worker"),
    pytest.param(RUNNING_2, failed(W1, 1, retryable=False), INERT, id="superseded-attempt"),
    pytest.param(
        RUNNING_2, failed(W1, 1, retryable=True, refund=True), INERT, id="superseded-refund"
    ),
]


@pytest.mark.parametrize(("history", "event", "expected"), FAILED_TABLE)
def test_failed(history: list[Event], event: Event, expected: dict[str, Any]) -> None:
    check(history, event, expected)


@pytest.mark.parametrize("status", SPEC_RESULT_STATUSES)
def test_non_retryable_failure_copies_each_spec_status_onto_result(status: str) -> None:
    check(RUNNING, failed(W1, 1, retryable=False, status=status), {"result": {"status": status}})


@pytest.mark.parametrize("status", SPEC_RESULT_STATUSES)
def test_retryable_failure_never_copies_its_status(status: str) -> None:
    after = check(RUNNING, failed(W1, 1, retryable=True, status=status), {"status": "queued"})
    assert after.result is None
    after = check(RUNNING_2, failed(W2, 2, retryable=True, status=status), {"status": "failed"})
    assert after.result is None


def test_refund_costs_no_attempt_and_the_next_lease_reuses_the_number() -> None:
    job = state(
        [
            *RUNNING_2,
            failed(W2, 2, retryable=True, refund=True, error="worker shutdown"),
            leased(W2, 2),
            heartbeat(W2, 2),
            failed(W2, 2, retryable=True, refund=True, error="worker shutdown"),
            leased(W2, 2),
        ]
    )
    assert (job.status, job.attempt, job.max_attempts) == ("leased", 2, 2)
    # the last attempt, once more: an ordinary retryable failure now exhausts it
    job = fold(receipts([failed(W2, 2, retryable=True)], start=job.seq + 1), job)
    assert job is not None
    assert job.status == "failed"


def test_retry_then_success() -> None:
    job = state([*RUNNING_2, progress(W2, 2), completed(W2, 2, result={"done": True})])
    assert job.status == "completed"
    assert job.attempt == 2
    assert job.result == {"done": True}


# --------------------------------------------------------------------------------------------
# job.lease_expired — queued if attempts are left, else failed "lease expired after <n> attempts"
# --------------------------------------------------------------------------------------------

LEASE_EXPIRED_TABLE = [
    pytest.param(
        RUNNING,
        lease_expired(W1, 1),
        {"status": "queued", "attempt": 1, "worker": None, "settled": False, "error": None},
        id="running-attempts-left-requeued",
    ),
    pytest.param(LEASED, lease_expired(W1, 1), {"status": "queued"}, id="leased-requeued"),
    pytest.param(
        STEER_CONSUMED,
        lease_expired(W1, 1),
        {"status": "queued", "pending": ["c1"]},
        id="consumed-commands-pending-again",
    ),
    pytest.param(
        REBOUND,
        lease_expired(W1B, 1),
        {"status": "queued", "worker": None},
        id="rebound-fence-requeued",
    ),
    pytest.param(
        RUNNING_2,
        lease_expired(W2, 2),
        {
            "status": "failed",
            "attempt": 2,
            "error": "lease expired after 2 attempts",
            "worker": None,
            "settled": True,
        },
        id="exhausted-failed",
    ),
    pytest.param(
        [enqueued(maxAttempts=1), leased(W1, 1)],
        lease_expired(W1, 1),
        {"status": "failed", "error": "lease expired after 1 attempts"},
        id="max-attempts-1",
    ),
    pytest.param(
        [
            enqueued(maxAttempts=3),
            leased(W1, 1),
            lease_expired(W1, 1),
            leased(W2, 2),
            lease_expired(W2, 2),
            leased("w3", 3),
        ],
        lease_expired("w3", 3),
        {"status": "failed", "attempt": 3, "error": "lease expired after 3 attempts"},
        id="max-attempts-3",
    ),
    pytest.param(RUNNING, lease_expired(W1B, 1), INERT, id="wrong-worker"),
    pytest.param(RUNNING, lease_expired(W1, 2), INERT, id="wrong-attempt"),
    pytest.param(RUNNING, lease_expired(W1, 0), INERT, id="older-attempt"),
    pytest.param(RUNNING, lease_expired(None, 1), INERT, id="no-worker"),
    pytest.param(REBOUND, lease_expired(W1, 1), INERT, id="rebound-old-fence"),
    pytest.param(QUEUED, lease_expired(None, 0), INERT, id="queued"),
    pytest.param(REQUEUED, lease_expired(W1, 1), INERT, id="requeued-duplicate"),
    pytest.param(RUNNING_2, lease_expired(W1, 1), INERT, id="superseded-attempt"),
]


@pytest.mark.parametrize(("history", "event", "expected"), LEASE_EXPIRED_TABLE)
def test_lease_expired(history: list[Event], event: Event, expected: dict[str, Any]) -> None:
    check(history, event, expected)


def test_lease_expired_message_is_the_design_text() -> None:
    assert jobs.lease_expired_message(2) == "lease expired after 2 attempts"


# --------------------------------------------------------------------------------------------
# queue.command / queue.command.consumed
# --------------------------------------------------------------------------------------------

COMMAND_TABLE = [
    pytest.param(
        QUEUED,
        command("a1", "abort", reason="singleton cancel"),
        {
            "status": "queued",
            "abortRequested": True,
            "abortReason": "singleton cancel",
            "commands": ["a1"],
            "pending": [],
        },
        id="abort-on-queued",
    ),
    pytest.param(
        RUNNING,
        command("a1", "abort", reason="user"),
        {"status": "running", "abortRequested": True, "abortReason": "user", "worker": W1},
        id="abort-on-running",
    ),
    pytest.param(
        LEASED,
        command("a1", "abort"),
        {"status": "leased", "abortRequested": True},
        id="abort-on-leased",
    ),
    pytest.param(
        RUNNING,
        command("c1", "steer"),
        {"abortRequested": False, "commands": ["c1"], "pending": ["c1"]},
        id="steer-pending",
    ),
    pytest.param(
        QUEUED,
        command("c1", "follow_up"),
        {"abortRequested": False, "pending": ["c1"]},
        id="follow-up-pending",
    ),
    pytest.param(
        [*RUNNING, command("c1", "steer")],
        command("c2", "follow_up"),
        {"pending": ["c1", "c2"]},
        id="second-command-appended",
    ),
    pytest.param(
        [*RUNNING, command("c1", "steer"), heartbeat(W1, 1), progress(W1, 1)],
        heartbeat(W1, 1),
        {"pending": ["c1"]},
        id="steer-stays-pending-until-consumed",
    ),
    pytest.param(
        [*RUNNING, command("c1", "steer")],
        consumed("c1", W1, 1),
        {"commands": ["c1"], "pending": []},
        id="consumed",
    ),
    pytest.param(
        [*RUNNING, command("c1", "steer"), command("c2", "follow_up")],
        consumed("c2", W1, 1),
        {"pending": ["c1"]},
        id="consumed-one-of-two",
    ),
    pytest.param(
        [*LEASED, command("c1", "steer")],
        consumed("c1", W1, 1),
        {"pending": []},
        id="consumed-while-leased",
    ),
    pytest.param(
        [*RUNNING, command("c1", "steer")],
        consumed("c1", W1B, 1),
        INERT,
        id="consumed-wrong-worker",
    ),
    pytest.param(
        [*RUNNING, command("c1", "steer")],
        consumed("c1", W1, 2),
        INERT,
        id="consumed-wrong-attempt",
    ),
    pytest.param(
        [*QUEUED, command("c1", "steer")], consumed("c1", None, 0), INERT, id="consumed-on-queued"
    ),
    pytest.param(
        [*RUNNING, command("c1", "steer")], consumed("nope", W1, 1), INERT, id="consumed-unknown"
    ),
    pytest.param(
        [*RUNNING, command("a1", "abort")], consumed("a1", W1, 1), INERT, id="consumed-an-abort"
    ),
    pytest.param(STEER_CONSUMED, consumed("c1", W1, 1), INERT, id="consumed-twice"),
    pytest.param(
        [*REQUEUED, command("c1", "steer"), leased(W2, 2)],
        consumed("c1", W1, 1),
        INERT,
        id="consumed-superseded-attempt",
    ),
]


@pytest.mark.parametrize(("history", "event", "expected"), COMMAND_TABLE)
def test_commands(history: list[Event], event: Event, expected: dict[str, Any]) -> None:
    check(history, event, expected)


def test_command_fields_are_recorded() -> None:
    job = state(
        [
            *RUNNING,
            command(
                "c1",
                "steer",
                reason=None,
                payload={"text": "go left"},
                fromSessionKey="session-1",
                fromEnqueue=True,
            ),
            consumed("c1", W1, 1),
        ]
    )
    (cmd,) = job.commands
    assert cmd.command_id == "c1"
    assert cmd.type == "steer"
    assert cmd.lane == "steer"
    assert cmd.seq == 4  # a reference to its receipt: the payload stays there
    assert "payload" not in job.to_json()["commands"][0]
    assert cmd.from_session_key == "session-1"
    assert cmd.from_enqueue is True
    assert cmd.recorded_at == at(4)
    assert cmd.consumed_attempt == 1
    assert cmd.pending is False


def test_a_state_stored_with_command_payloads_still_reads_and_folds() -> None:
    stored = state([*RUNNING, command("c1", "follow_up", payload={"n": 1})]).to_json()
    del stored["commands"][0]["seq"]
    stored["commands"][0]["payload"] = {"n": 1}  # as states were stored before references
    job = Job.model_validate(stored)
    assert [(c.command_id, c.seq) for c in job.pending_commands] == [("c1", None)]
    job = fold(receipts([consumed("c1", W1, 1)], start=job.seq + 1), job)
    assert job is not None and job.pending_commands == ()
    assert job.commands[0].consumed_attempt == 1


def test_abort_command_is_never_pending_and_has_no_lane() -> None:
    """J3: the command lanes are `steer` and `follow_up` only. The receipts are the ones the
    production code writes (`receipts.enqueue.command_draft`), not this file's helper."""
    from receipts.enqueue import command_draft

    drafts = [
        command_draft("a1", "abort", reason="user"),
        command_draft("s1", "steer", payload={"say": "left"}),
        command_draft("f1", "follow_up", payload="and then"),
    ]
    job = state([*RUNNING, *((d.type, d.data) for d in drafts)])
    assert [(c.command_id, c.lane) for c in job.commands] == [
        ("a1", None),
        ("s1", "steer"),
        ("f1", "follow_up"),
    ]
    assert [c.command_id for c in job.pending_commands] == ["s1", "f1"]
    assert job.abort_requested and job.abort_reason == "user"


def test_a_steer_is_never_lost_with_a_dead_worker() -> None:
    job = state(
        [
            *RUNNING,
            command("c1", "steer"),
            consumed("c1", W1, 1),
            lease_expired(W1, 1),  # attempt 1 died: c1 pending again
            leased(W2, 2),
            heartbeat(W2, 2),
        ]
    )
    assert [c.command_id for c in job.pending_commands] == ["c1"]
    job = fold(receipts([consumed("c1", W2, 2)], start=job.seq + 1), job)
    assert job is not None
    assert job.commands[0].consumed_attempt == 2
    job = fold(receipts([completed(W2, 2)], start=job.seq + 1), job)
    assert job is not None
    assert job.status == "completed"
    assert job.pending_commands == ()


def test_requeue_releases_commands_consumed_by_the_attempt_that_did_not_complete() -> None:
    job = state(
        [
            *RUNNING,
            command("c1", "steer"),
            consumed("c1", W1, 1),
            failed(W1, 1, retryable=True),
            leased(W2, 2),
            command("c2", "follow_up"),
            consumed("c1", W2, 2),
            consumed("c2", W2, 2),
        ]
    )
    assert [c.consumed_attempt for c in job.commands] == [2, 2]
    # a retryable refund of attempt 2 releases both
    job = fold(receipts([failed(W2, 2, retryable=True, refund=True)], start=job.seq + 1), job)
    assert job is not None
    assert [c.command_id for c in job.pending_commands] == ["c1", "c2"]


# --------------------------------------------------------------------------------------------
# job.canceled
# --------------------------------------------------------------------------------------------

CANCELED_TABLE = [
    pytest.param(
        QUEUED,
        canceled(attempt=0, reason="singleton cancel"),
        {
            "status": "canceled",
            "canceledReason": "singleton cancel",
            "settled": True,
            "worker": None,
        },
        id="queued-no-worker-canceled",
    ),
    pytest.param(
        REQUEUED,
        canceled(attempt=1, reason="user"),
        {"status": "canceled", "attempt": 1, "canceledReason": "user"},
        id="requeued-no-worker-canceled",
    ),
    pytest.param(
        [*QUEUED, command("a1", "abort")],
        canceled(attempt=0, reason="abort"),
        {"status": "canceled", "abortRequested": True},
        id="queued-with-abort-canceled",
    ),
    pytest.param(
        RUNNING,
        canceled(W1, 1, reason="abort honoured"),
        {
            "status": "canceled",
            "canceledReason": "abort honoured",
            "settlementId": W1,
            "worker": None,
            "settled": True,
        },
        id="running-worker-fence-canceled",
    ),
    pytest.param(LEASED, canceled(W1, 1), {"status": "canceled"}, id="leased-worker-fence"),
    pytest.param(REBOUND, canceled(W1B, 1), {"status": "canceled"}, id="rebound-new-fence"),
    pytest.param(RUNNING, canceled(attempt=1), INERT, id="running-without-worker"),
    pytest.param(LEASED, canceled(attempt=1), INERT, id="leased-without-worker"),
    pytest.param(RUNNING, canceled(W1B, 1), INERT, id="running-other-worker"),
    pytest.param(RUNNING, canceled(W1, 2), INERT, id="running-other-attempt"),
    pytest.param(QUEUED, canceled(W1, 0), INERT, id="queued-with-a-worker"),
    pytest.param(REBOUND, canceled(W1, 1), INERT, id="rebound-old-fence"),
    pytest.param(RUNNING_2, canceled(W1, 1), INERT, id="superseded-attempt"),
]


@pytest.mark.parametrize(("history", "event", "expected"), CANCELED_TABLE)
def test_canceled(history: list[Event], event: Event, expected: dict[str, Any]) -> None:
    check(history, event, expected)


# --------------------------------------------------------------------------------------------
# Terminal jobs ignore everything
# --------------------------------------------------------------------------------------------

AFTER_TERMINAL: dict[str, Event] = {
    "enqueued": enqueued(),
    "leased": leased(W2, 2),
    "heartbeat": heartbeat(W1, 1),
    "heartbeat-attempt-2": heartbeat(W2, 2),
    "heartbeat-start-fence": heartbeat(W1B, 1, start_fence=True),
    "progress": progress(W1, 1),
    "completed": completed(W1, 1),
    "completed-attempt-2": completed(W2, 2),
    "failed-retryable": failed(W1, 1, retryable=True),
    "failed-refund": failed(W2, 2, retryable=True, refund=True),
    "failed-system": failed(None, 1, retryable=False),
    "failed-system-attempt-0": failed(None, 0, retryable=False),
    "failed-system-attempt-2": failed(None, 2, retryable=False),
    "canceled-no-worker": canceled(attempt=1),
    "canceled-no-worker-attempt-0": canceled(attempt=0),
    "canceled-worker": canceled(W1, 1),
    "command-abort": command("a1", "abort", reason="late"),
    "command-steer": command("c9", "steer"),
    "command-consumed": consumed("c1", W1, 1),
    "lease-expired": lease_expired(W1, 1),
    "lease-expired-attempt-2": lease_expired(W2, 2),
}


def test_after_terminal_events_cover_every_receipt_type() -> None:
    assert {kind for kind, _ in AFTER_TERMINAL.values()} == set(RECEIPT_TYPES)


@pytest.mark.parametrize("event_name", list(AFTER_TERMINAL))
@pytest.mark.parametrize("history_name", TERMINAL_HISTORIES)
def test_terminal_jobs_ignore_everything(history_name: str, event_name: str) -> None:
    history = [*HISTORIES[history_name]]
    if history_name != "canceled":
        # give the job a pending steer so `queue.command.consumed` has something to hit
        history = [*history[:3], command("c1", "steer"), *history[3:]]
    before, after = step(history, AFTER_TERMINAL[event_name])
    assert before.terminal
    assert after == before.model_copy(update={"seq": after.seq})


# --------------------------------------------------------------------------------------------
# fold / lease helpers
# --------------------------------------------------------------------------------------------


def test_fold_equals_applying_one_by_one_and_resumes_from_a_state() -> None:
    history = [
        *RUNNING,
        command("c1", "steer"),
        consumed("c1", W1, 1),
        lease_expired(W1, 1),
        leased(W2, 2),
        heartbeat(W2, 2),
        progress(W2, 2),
        completed(W2, 2),
    ]
    rs = receipts(history)
    job: Job | None = None
    for r in rs:
        job = apply(job, r)
    assert fold(rs) == job
    for cut in range(len(rs) + 1):
        assert fold(rs[cut:], fold(rs[:cut])) == job
    assert job is not None
    assert Job.model_validate(job.to_json()) == job


def test_lease_expired_helper_uses_strictly_after() -> None:
    job = state(RUNNING)
    assert job.lease is not None
    expiry = job.lease.expires_at
    assert jobs.lease_expired(job, expiry + timedelta(microseconds=1))
    assert not jobs.lease_expired(job, expiry)
    assert not jobs.lease_expired(state(QUEUED), expiry + timedelta(days=1))
    assert not jobs.lease_expired(state(COMPLETED), expiry + timedelta(days=1))


def test_stale_lease_helper() -> None:
    job = state(RUNNING)  # last heartbeat at(3), lease expires at HEARTBEAT_EXPIRES
    stale_ms = 600_000
    assert not jobs.stale_lease(job, at(3) + timedelta(milliseconds=stale_ms), stale_ms)
    assert jobs.stale_lease(job, at(3) + timedelta(milliseconds=stale_ms + 1), stale_ms)
    assert jobs.stale_lease(job, HEARTBEAT_EXPIRES + timedelta(seconds=1), 10**12)
    leased_only = state(LEASED)  # no heartbeat yet: measured from the lease
    assert jobs.stale_lease(leased_only, at(2) + timedelta(milliseconds=stale_ms + 1), stale_ms)
    assert not jobs.stale_lease(state(REQUEUED), at(1) + timedelta(days=30), stale_ms)
    assert not jobs.stale_lease(state(COMPLETED), at(1) + timedelta(days=30), stale_ms)


# --------------------------------------------------------------------------------------------
# receipts.operations.fence_rejection (pure)
# --------------------------------------------------------------------------------------------

NOW = T0 + timedelta(minutes=10)


def test_fence_rejection_statuses_are_the_spec_strings() -> None:
    assert operations.STALE_ATTEMPT == "stale_attempt"
    assert operations.LEASE_LOST == "lease_lost"
    assert operations.TERMINAL_STATE == "terminal_state"
    assert operations.SETTLEMENT_CONFLICT == "settlement_conflict"
    assert operations.NOT_FOUND == "not_found"


FENCE_TABLE = [
    pytest.param(None, W1, 1, NOW, "not_found", id="not-found"),
    pytest.param("completed", W1, 1, NOW, "terminal_state", id="completed"),
    pytest.param("failed", W1, 1, NOW, "terminal_state", id="failed"),
    pytest.param("canceled", W1, 0, NOW, "terminal_state", id="canceled"),
    pytest.param("expired_out", W2, 2, NOW, "terminal_state", id="expired-out"),
    pytest.param("running_2", W1, 1, NOW, "stale_attempt", id="older-attempt"),
    pytest.param("running_2", W2, 1, NOW, "stale_attempt", id="older-attempt-current-worker"),
    pytest.param("expired_out", W1, 1, NOW, "terminal_state", id="terminal-before-stale"),
    pytest.param("requeued", W1, 0, NOW, "stale_attempt", id="queued-older-attempt"),
    pytest.param("requeued", W1, 1, NOW, "lease_lost", id="queued-after-retry"),
    pytest.param("queued", W1, 0, NOW, "lease_lost", id="queued-never-leased"),
    pytest.param("running", W1B, 1, NOW, "lease_lost", id="other-worker"),
    pytest.param("rebound", W1, 1, NOW, "lease_lost", id="rebound-old-delivery"),
    pytest.param(
        "running",
        W1,
        1,
        HEARTBEAT_EXPIRES + timedelta(microseconds=1),
        "lease_lost",
        id="expired-by-now",
    ),
    pytest.param(
        "leased",
        W1,
        1,
        LEASE_EXPIRES + timedelta(seconds=1),
        "lease_lost",
        id="leased-expired-by-now",
    ),
    pytest.param("running", W1, 1, HEARTBEAT_EXPIRES, None, id="valid-at-expiry-instant"),
    pytest.param("running", W1, 1, NOW, None, id="valid-running"),
    pytest.param("leased", W1, 1, NOW, None, id="valid-leased"),
    pytest.param("rebound", W1B, 1, NOW, None, id="valid-rebound-delivery"),
    pytest.param("running_2", W2, 2, NOW, None, id="valid-attempt-2"),
]


@pytest.mark.parametrize(("history", "worker", "attempt", "now", "expected"), FENCE_TABLE)
def test_fence_rejection(
    history: str | None, worker: str, attempt: int, now: datetime, expected: str | None
) -> None:
    job = state(HISTORIES[history]) if history else None
    assert fence_rejection(job, worker, attempt, now) == expected


def test_fence_rejection_agrees_with_the_reducer_on_a_valid_fence() -> None:
    """When the pure check accepts a write, the reducer's active-lease check accepts it too."""
    for name in ("leased", "running", "rebound", "running_2"):
        job = state(HISTORIES[name])
        assert job.lease is not None
        fence = (job.lease.worker_id, job.lease.attempt)
        assert fence_rejection(job, *fence, NOW) is None
        assert jobs.fence_matches(job, *fence)


# --------------------------------------------------------------------------------------------
# receipts.kinds: routing, contracts, payload validation (spec "Payload kinds", docs/design.md §5)
# --------------------------------------------------------------------------------------------

SPEC_KINDS = (
    "factory.dispatch",
    "factory.run",
    "factory.integration.publish",
    "factory.integration.validate",
    "factory.objective.audit",
    "factory.objective.control",
    "factory.objective.watchdog",
    "factory.task.monitor",
    "factory.task.run",
)

ROUTE_TABLE = [
    # job.agentId === "codex" -> receipt-codex
    ("codex", "factory.task.run", "receipt-codex"),
    ("codex", "factory.dispatch", "receipt-codex"),
    ("codex", "factory.objective.control", "receipt-codex"),
    # job.payload.kind startsWith "factory.integration." -> receipt-codex (any agent)
    ("factory", "factory.integration.publish", "receipt-codex"),
    ("factory", "factory.integration.validate", "receipt-codex"),
    ("factory-control", "factory.integration.publish", "receipt-codex"),
    ("factory-monitor", "factory.integration.validate", "receipt-codex"),
    ("nobody", "factory.integration.publish", "receipt-codex"),
    # job.agentId === "factory-control" -> receipt-control
    ("factory-control", "factory.objective.control", "receipt-control"),
    ("factory-control", "factory.dispatch", "receipt-control"),
    ("factory-control", "factory.task.run", "receipt-control"),
    ("factory-control", "factory.objective.watchdog", "receipt-control"),
    # otherwise -> receipt-chat
    ("factory", "factory.dispatch", "receipt-chat"),
    ("factory", "factory.run", "receipt-chat"),
    ("factory", "factory.task.run", "receipt-chat"),
    ("factory-monitor", "factory.task.monitor", "receipt-chat"),
    ("nobody", "factory.task.run", "receipt-chat"),
    ("nobody", "factory.dispatch", "receipt-chat"),
    ("", "factory.run", "receipt-chat"),
    ("Codex", "factory.task.run", "receipt-chat"),
    ("factory", "factory.integration", "receipt-chat"),
    ("factory", "factory.integrationX.publish", "receipt-chat"),
]


@pytest.mark.parametrize(("agent_id", "kind", "queue"), ROUTE_TABLE)
def test_route_is_agent_id_first_then_kind(agent_id: str, kind: str, queue: str) -> None:
    assert route(agent_id, kind) == queue


DISAGREE_TABLE = [
    ("factory", "factory.dispatch", True),
    ("factory", "factory.run", True),
    ("factory", "factory.objective.control", True),
    ("factory", "factory.task.run", True),
    ("nobody", "factory.dispatch", True),
    ("codex", "factory.dispatch", True),
    ("factory-control", "factory.dispatch", False),
    ("factory-control", "factory.objective.watchdog", False),
    ("codex", "factory.task.run", False),
    ("factory", "factory.integration.publish", False),
    ("factory-control", "factory.integration.validate", False),
    ("factory", "not.a.kind", False),
]


@pytest.mark.parametrize(("agent_id", "kind", "disagrees"), DISAGREE_TABLE)
def test_route_disagrees(agent_id: str, kind: str, disagrees: bool) -> None:
    assert route_disagrees(agent_id, kind) is disagrees


# kind: (workerGroup, workflow, durable activity, objective scoped, reconcile, live, audit)
# worker group, workflow, durable activity, objective scoped, objective required, reconcile on
# terminal, live execution, terminal audit (docs/design.md §5).
CONTRACT_TABLE: dict[str, tuple[str, str | None, bool, bool, bool, bool, bool, bool]] = {
    "factory.dispatch": ("control", "factory.dispatch", False, True, True, False, False, False),
    "factory.run": ("control", "factory.run", False, True, False, True, False, False),
    "factory.integration.publish": (
        "codex",
        "factory.integration",
        False,
        True,
        True,
        True,
        True,
        False,
    ),
    "factory.integration.validate": (
        "codex",
        "factory.integration",
        False,
        True,
        True,
        True,
        True,
        False,
    ),
    "factory.objective.audit": ("control", None, False, True, True, False, False, False),
    "factory.objective.control": (
        "control",
        "factory.objective",
        False,
        True,
        True,
        False,
        False,
        True,
    ),
    "factory.objective.watchdog": ("control", None, False, False, False, False, False, False),
    "factory.task.monitor": ("control", None, False, True, True, False, False, False),
    "factory.task.run": ("codex", "factory.task", True, True, False, True, True, False),
}


def test_kinds_are_the_spec_nine() -> None:
    assert KINDS == SPEC_KINDS
    assert set(CONTRACTS) == set(CONTRACT_TABLE) == set(SPEC_KINDS)


@pytest.mark.parametrize("kind", SPEC_KINDS)
def test_contract_table_row(kind: str) -> None:
    c = CONTRACTS[kind]
    assert c.kind == kind
    got = (
        c.worker_group,
        c.workflow,
        c.has_durable_activity,
        c.objective_scoped,
        c.objective_required,
        c.reconciles_objective,
        c.live_execution,
        c.terminal_objective_audit,
    )
    assert got == CONTRACT_TABLE[kind]


def test_only_task_run_has_durable_activity() -> None:
    assert [k for k, c in CONTRACTS.items() if c.has_durable_activity] == ["factory.task.run"]


AUTH = {"userId": "user-1", "organizationId": "org-1"}


@pytest.mark.parametrize("kind", SPEC_KINDS)
def test_validate_payload_accepts_each_kind_with_auth(kind: str) -> None:
    assert validate_payload({"kind": kind, "authContext": dict(AUTH)}) == (kind, "org-1")


def test_validate_payload_accepts_optional_auth_fields() -> None:
    auth = {
        **AUTH,
        "workspaceId": "ws",
        "receiptConnectGatewayUrl": "https://gw.example",
        "sessionId": "sess",
        "source": "cli",
    }
    assert validate_payload({"kind": "factory.run", "authContext": auth}) == (
        "factory.run",
        "org-1",
    )


def test_watchdog_needs_no_auth_context() -> None:
    assert validate_payload({"kind": "factory.objective.watchdog"}) == (
        "factory.objective.watchdog",
        None,
    )


@pytest.mark.parametrize(
    "payload",
    [
        {"kind": "factory.nope", "authContext": AUTH},
        {"kind": "", "authContext": AUTH},
        {"kind": None, "authContext": AUTH},
        {"kind": 7, "authContext": AUTH},
        {"authContext": AUTH},
        {"kind": "factory.integration.", "authContext": AUTH},
        {"kind": "Factory.Run", "authContext": AUTH},
    ],
)
def test_unknown_kind_names_all_nine(payload: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput) as raised:
        validate_payload(payload)
    assert raised.value.field == "payload.kind"
    assert raised.value.allowed == list(SPEC_KINDS)
    for kind in SPEC_KINDS:
        assert kind in raised.value.message


@pytest.mark.parametrize("payload", [None, "factory.run", ["factory.run"], 3])
def test_payload_must_be_an_object(payload: Any) -> None:
    with pytest.raises(InvalidInput) as raised:
        validate_payload(payload)
    assert raised.value.field == "payload"


@pytest.mark.parametrize("kind", [k for k in SPEC_KINDS if k != "factory.objective.watchdog"])
@pytest.mark.parametrize("auth", [None, "user-1", ["user-1"]], ids=["missing", "string", "list"])
def test_missing_auth_context(kind: str, auth: Any) -> None:
    payload: dict[str, Any] = {"kind": kind}
    if auth is not None:
        payload["authContext"] = auth
    with pytest.raises(InvalidInput) as raised:
        validate_payload(payload)
    assert raised.value.field == "payload.authContext"


AUTH_FIELD_TABLE = [
    ("userId", "missing"),
    ("userId", ""),
    ("userId", "   "),
    ("userId", None),
    ("userId", 42),
    ("organizationId", "missing"),
    ("organizationId", ""),
    ("organizationId", "  \t"),
    ("organizationId", None),
    ("organizationId", ["org-1"]),
]


@pytest.mark.parametrize("kind", ["factory.run", "factory.objective.watchdog"])
@pytest.mark.parametrize(("name", "value"), AUTH_FIELD_TABLE)
def test_auth_context_required_fields(kind: str, name: str, value: Any) -> None:
    auth: dict[str, Any] = dict(AUTH)
    if value == "missing":
        del auth[name]
    else:
        auth[name] = value
    with pytest.raises(InvalidInput) as raised:
        validate_payload({"kind": kind, "authContext": auth})
    assert raised.value.field == f"payload.authContext.{name}"
    assert f"payload.authContext.{name}" in raised.value.message


@pytest.mark.parametrize("name", ["workspaceId", "receiptConnectGatewayUrl", "sessionId", "source"])
def test_auth_context_optional_fields_must_be_strings(name: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        validate_payload({"kind": "factory.run", "authContext": {**AUTH, name: 5}})
    assert raised.value.field == f"payload.authContext.{name}"


# --------------------------------------------------------------------------------------------
# receipts.enqueue.parse_enqueue
# --------------------------------------------------------------------------------------------


def body(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "payload": {"kind": "factory.dispatch", "authContext": dict(AUTH), "objectiveId": "o-1"}
    }
    data.update(overrides)
    return data


def test_parse_enqueue_defaults() -> None:
    request = parse_enqueue("factory", body())
    assert request.agent_id == "factory"
    assert request.kind == "factory.dispatch"
    assert request.organization_id == "org-1"
    assert request.lane == "collect"
    assert request.singleton_mode == "allow"
    assert request.max_attempts == 2
    assert request.job_id is None
    assert request.session_key is None
    assert request.delay_ms == 0


def test_parse_enqueue_accepts_an_unknown_agent_id() -> None:
    assert parse_enqueue("nobody-home", body()).agent_id == "nobody-home"


@pytest.mark.parametrize("lane", ["chat", "collect", "steer", "follow_up"])
def test_parse_enqueue_accepts_the_four_lanes(lane: str) -> None:
    assert parse_enqueue("factory", body(lane=lane)).lane == lane


def test_parse_enqueue_singleton_mode_none_is_allow() -> None:
    """The spec's `singletonMode` defaults to `allow`: written null (as the OpenAPI document
    allows it) too."""
    assert parse_enqueue("factory", body(singletonMode=None)).singleton_mode == "allow"


def test_parse_enqueue_lane_none_is_the_default() -> None:
    assert parse_enqueue("factory", body(lane=None)).lane == "collect"


@pytest.mark.parametrize("lane", ["urgent", "Chat", "", "abort", 3, ["chat"]])
def test_parse_enqueue_rejects_other_lanes_naming_the_four(lane: Any) -> None:
    with pytest.raises(InvalidInput) as raised:
        parse_enqueue("factory", body(lane=lane))
    assert raised.value.field == "lane"
    assert raised.value.allowed == ["chat", "collect", "steer", "follow_up"]


@pytest.mark.parametrize("mode", ["allow", "cancel", "steer"])
def test_parse_enqueue_singleton_modes(mode: str) -> None:
    request = parse_enqueue("factory", body(singletonMode=mode, sessionKey="s-1"))
    assert request.singleton_mode == mode
    assert request.session_key == "s-1"


@pytest.mark.parametrize("mode", ["replace", "ALLOW", "", 1])
def test_parse_enqueue_rejects_other_singleton_modes(mode: Any) -> None:
    with pytest.raises(InvalidInput) as raised:
        parse_enqueue("factory", body(singletonMode=mode))
    assert raised.value.field == "singletonMode"
    assert raised.value.allowed == ["allow", "cancel", "steer"]


MAX_ATTEMPTS_TABLE = [
    pytest.param({}, 2, id="absent-default-2"),
    pytest.param({"maxAttempts": None}, 2, id="null-default-2"),
    pytest.param({"maxAttempts": 0}, 1, id="0-clamped-1"),
    pytest.param({"maxAttempts": -5}, 1, id="negative-clamped-1"),
    pytest.param({"maxAttempts": 1}, 1, id="1"),
    pytest.param({"maxAttempts": 5}, 5, id="5"),
    pytest.param({"maxAttempts": 8}, 8, id="8"),
    pytest.param({"maxAttempts": 9}, 8, id="9-clamped-8"),
    pytest.param({"maxAttempts": 10**9}, 8, id="huge-clamped-8"),
    # JSON does not tell 2 from 2.0: a number with no fraction is that integer, clamped alike.
    pytest.param({"maxAttempts": 2.0}, 2, id="2.0-is-2"),
    pytest.param({"maxAttempts": 9.0}, 8, id="9.0-clamped-8"),
]


@pytest.mark.parametrize(("extra", "expected"), MAX_ATTEMPTS_TABLE)
def test_parse_enqueue_max_attempts(extra: dict[str, Any], expected: int) -> None:
    assert parse_enqueue("factory", body(**extra)).max_attempts == expected


@pytest.mark.parametrize("value", ["two", "2", 2.5, float("nan"), True, False, [2], {"n": 2}])
def test_parse_enqueue_rejects_non_integer_max_attempts(value: Any) -> None:
    with pytest.raises(InvalidInput) as raised:
        parse_enqueue("factory", body(maxAttempts=value))
    assert raised.value.field == "maxAttempts"


CLEAN_TEXT_TABLE = [
    pytest.param(
        body(payload={"kind": "factory.run", "authContext": {**AUTH, "userId": "u\u0000"}}),
        "payload.authContext.userId",
        id="nul-in-user-id",
    ),
    pytest.param(
        body(payload={"kind": "factory.run", "authContext": AUTH, "note": "\ud800"}),
        "payload.note",
        id="surrogate-in-payload",
    ),
    pytest.param(
        body(payload={"kind": "factory.run", "authContext": AUTH, "items": ["ok", "x\ud800y"]}),
        "payload.items[1]",
        id="surrogate-in-list",
    ),
    pytest.param(
        body(payload={"kind": "factory.run", "authContext": AUTH, "deep": {"a": [{"b": "\x00"}]}}),
        "payload.deep.a[0].b",
        id="nul-deeply-nested",
    ),
    pytest.param(
        body(payload={"kind": "factory.run", "authContext": AUTH, "k\u0000": 1}),
        None,
        id="nul-in-a-key",
    ),
    pytest.param(
        body(payload={"kind": "factory.run", "authContext": AUTH, "\udfff": 1}),
        None,
        id="low-surrogate-key",
    ),
    pytest.param(body(sessionKey="s\u0000"), "sessionKey", id="nul-in-session-key"),
    pytest.param(body(jobId="\ud800"), "jobId", id="surrogate-in-job-id"),
    pytest.param(body(lane="chat\u0000"), "lane", id="nul-in-lane"),
    pytest.param(body(traceId="t\ud800"), "traceId", id="surrogate-in-trace-id"),
    pytest.param(body(extra={"x": "\u0000"}), "extra.x", id="nul-in-unknown-field"),
]


@pytest.mark.parametrize(("request_body", "field"), CLEAN_TEXT_TABLE)
def test_parse_enqueue_rejects_nul_and_lone_surrogates(
    request_body: dict[str, Any], field: str | None
) -> None:
    with pytest.raises(InvalidInput) as raised:
        parse_enqueue("factory", request_body)
    if field is not None:
        assert raised.value.field == field


@pytest.mark.parametrize("agent_id", ["fac\u0000tory", "\ud800"])
def test_parse_enqueue_rejects_bad_text_in_the_agent_id(agent_id: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        parse_enqueue(agent_id, body())
    assert raised.value.field == "agentId"


def test_parse_enqueue_accepts_a_paired_surrogate_character() -> None:
    payload = {"kind": "factory.run", "authContext": AUTH, "emoji": "\U0001f600"}
    assert parse_enqueue("factory", body(payload=payload)).payload["emoji"] == "\U0001f600"


def test_parse_enqueue_rejects_an_unknown_kind_naming_the_nine() -> None:
    with pytest.raises(InvalidInput) as raised:
        parse_enqueue("factory", body(payload={"kind": "nope", "authContext": AUTH}))
    assert raised.value.field == "payload.kind"
    assert raised.value.allowed == list(SPEC_KINDS)
