"""Property tests of the job reducer over random receipt sequences of all ten types.

Two generators:

* `random_events` — context-free receipts with small-alphabet workerIds, attempts and flags,
  optionally led by `job.enqueued` (exercises the missing-job invariant and plain robustness);
* `lifecycles` — starts with `job.enqueued` and draws each next receipt knowing the current
  state, so fences often match the active lease, a stale lease or the system fence, and jobs
  really move through leases, rebinds, retries, refunds, expiries and terminal states.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from receipts.errors import InvariantError
from receipts.jobs import (
    LEASED_STATUSES,
    RECEIPT_TYPES,
    STATUSES,
    TERMINAL_STATUSES,
    Job,
    Receipt,
    apply,
    fold,
    job_stream,
    no_job_message,
)

JOB_ID = "job-p"
STREAM = job_stream(JOB_ID)
T0 = datetime(2025, 1, 1, tzinfo=UTC)

SETTINGS = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

SIX_STATUSES = {"queued", "leased", "running", "completed", "failed", "canceled"}
IGNORED_WHEN_MISSING = {"job.failed", "job.lease_expired"}
WORKERS = ("w1", "w2", "w3")
COMMAND_IDS = ("c1", "c2", "c3")
RESULT_STATUSES = (
    "settlement_conflict",
    "stale_attempt",
    "lease_lost",
    "terminal_state",
    "canceled",
    "execution_timeout",
    "failed",
)
# Receipts that carry a (workerId, attempt) fence the reducer checks.
FENCED_TYPES = (
    "job.heartbeat",
    "job.progress",
    "job.completed",
    "job.failed",
    "job.canceled",
    "queue.command.consumed",
    "job.lease_expired",
)

Event = tuple[str, dict[str, Any]]
Fence = tuple[str | None, int | None]

# ---------------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------------

worker_ids = st.sampled_from((None, *WORKERS))
attempt_values = st.one_of(st.none(), st.integers(0, 4))
random_fences: st.SearchStrategy[Fence] = st.tuples(worker_ids, attempt_values)
expiries = st.integers(0, 600).map(lambda m: (T0 + timedelta(minutes=m)).isoformat())
json_values = st.one_of(
    st.none(),
    st.integers(-3, 3),
    st.sampled_from(("", "a", "ok")),
    st.fixed_dictionaries({"k": st.integers(0, 3)}),
    st.lists(st.integers(0, 3), max_size=2),
)
reasons = st.sampled_from((None, "singleton cancel", "user", "abort"))


def enqueued_data(
    max_attempts: st.SearchStrategy[int] | None = None,
) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "jobId": st.just(JOB_ID),
            "agentId": st.sampled_from(("factory", "codex", "factory-control", "nobody")),
            "lane": st.sampled_from(("chat", "collect", "steer", "follow_up")),
            "kind": st.sampled_from(("factory.dispatch", "factory.task.run")),
            "payload": st.just({"kind": "factory.dispatch"}),
            "organizationId": st.sampled_from(("org-1", None)),
            "sessionKey": st.sampled_from(("s-1", None)),
            "singletonMode": st.sampled_from(("allow", "cancel", "steer")),
            "maxAttempts": st.sampled_from((1, 2, 3, 8)) if max_attempts is None else max_attempts,
        }
    )


COMMAND_DATA = st.fixed_dictionaries(
    {
        "commandId": st.sampled_from(COMMAND_IDS),
        "type": st.sampled_from(("steer", "follow_up", "abort")),
        "payload": json_values,
        "reason": reasons,
    },
    optional={"fromSessionKey": st.just("s-1"), "fromEnqueue": st.booleans()},
).map(lambda d: {**d, "lane": None if d["type"] == "abort" else d["type"]})
settlement_ids = st.sampled_from(WORKERS)
# What a fenced receipt carries besides its (workerId, attempt).
REST: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "job.leased": st.fixed_dictionaries({"expiresAt": expiries}),
    "job.heartbeat": st.fixed_dictionaries(
        {"expiresAt": expiries}, optional={"startFence": st.booleans()}
    ),
    "job.progress": st.fixed_dictionaries({"data": json_values}),
    "job.completed": st.fixed_dictionaries(
        {"result": json_values}, optional={"settlementId": settlement_ids}
    ),
    "job.failed": st.fixed_dictionaries(
        {"error": st.sampled_from(("boom", "worker shutdown")), "retryable": st.booleans()},
        optional={
            "status": st.sampled_from(RESULT_STATUSES),
            "refundAttempt": st.booleans(),
            "result": json_values,
            "settlementId": settlement_ids,
        },
    ),
    "job.canceled": st.fixed_dictionaries(
        {"reason": reasons}, optional={"settlementId": settlement_ids}
    ),
    "queue.command.consumed": st.fixed_dictionaries({"commandId": st.sampled_from(COMMAND_IDS)}),
    "job.lease_expired": st.fixed_dictionaries({}, optional={"expiresAt": expiries}),
}
ENQUEUED_DATA = enqueued_data()


def fenced(kind: str, fence: Fence, rest: dict[str, Any]) -> dict[str, Any]:
    worker, attempt = fence
    if kind == "job.leased" and worker is None:
        worker = "w1"  # leases always name a delivery (operations never lease without one)
    return {"workerId": worker, "attempt": attempt, **rest}


def draw_data(draw: st.DrawFn, kind: str, fence: Fence) -> dict[str, Any]:
    """Data of a `kind` receipt fenced by `fence` (ignored by enqueued and queue.command)."""
    if kind == "job.enqueued":
        return draw(ENQUEUED_DATA)
    if kind == "queue.command":
        return draw(COMMAND_DATA)
    return fenced(kind, fence, draw(REST[kind]))


@st.composite
def event_data(draw: st.DrawFn, kind: str, fence: Fence) -> dict[str, Any]:
    return draw_data(draw, kind, fence)


@st.composite
def any_event(draw: st.DrawFn) -> Event:
    kind = draw(ALL_TYPES)
    return kind, draw_data(draw, kind, draw(random_fences))


@st.composite
def random_events(draw: st.DrawFn) -> list[Event]:
    events = draw(st.lists(any_event(), max_size=25))
    if draw(st.booleans()):
        events = [("job.enqueued", draw(ENQUEUED_DATA)), *events]
    return events


ALL_TYPES = st.sampled_from(RECEIPT_TYPES)
# All ten types, weighted towards ones that move the job from where it is.
QUEUED_TYPES = st.sampled_from((*RECEIPT_TYPES, *["job.leased"] * 4))
LEASED_TYPES = st.sampled_from(
    (
        *RECEIPT_TYPES,
        *("job.heartbeat", "job.failed", "job.failed", "job.lease_expired"),
        *("queue.command", "queue.command.consumed", "queue.command.consumed"),
    )
)
FENCE_MODES = st.sampled_from(("current",) * 4 + ("rebind", "system", "history", "random"))
WORKER_NAMES = st.sampled_from(WORKERS)


def draw_fence(draw: st.DrawFn, job: Job, history: Sequence[Fence]) -> Fence:
    """A fence that matters for `job`: its lease (weighted), a start-fence rebind of it, one it
    held before, the system fence, or a random one."""
    mode = draw(FENCE_MODES)
    lease = job.lease
    if lease is not None and mode == "current":
        return (lease.worker_id, lease.attempt)
    if lease is not None and mode == "rebind":
        return (draw(WORKER_NAMES), lease.attempt)
    if mode == "system":
        return (None, job.attempt)
    if history and mode == "history":
        return history[draw(st.integers(0, len(history) - 1))]
    return draw(random_fences)


def types_for(job: Job) -> st.SearchStrategy[str]:
    if job.status == "queued":
        return QUEUED_TYPES
    if job.status in LEASED_STATUSES:
        return LEASED_TYPES
    return ALL_TYPES


def to_receipts(events: Sequence[Event], start: int = 1) -> list[Receipt]:
    return [
        Receipt(STREAM, start + i, kind, data, T0 + timedelta(seconds=start + i))
        for i, (kind, data) in enumerate(events)
    ]


def record_fence(job: Job | None, history: list[Fence]) -> None:
    if job is not None and job.lease is not None:
        fence = (job.lease.worker_id, job.lease.attempt)
        if fence not in history:
            history.append(fence)


def next_state(job: Job, event: Event) -> Job:
    new = apply(job, to_receipts([event], start=job.seq + 1)[0])
    assert new is not None
    return new


@st.composite
def lifecycles(draw: st.DrawFn, max_len: int = 25) -> list[Event]:
    """A state-aware sequence that starts with `job.enqueued`."""
    events: list[Event] = [("job.enqueued", draw(ENQUEUED_DATA))]
    job = fold(to_receipts(events))
    assert job is not None
    history: list[Fence] = []
    for _ in range(draw(st.integers(0, max_len))):
        kind = draw(types_for(job))
        event = (kind, draw_data(draw, kind, draw_fence(draw, job, history)))
        pending = [c.command_id for c in job.pending_commands]
        if kind == "queue.command.consumed" and pending and draw(st.booleans()):
            event[1]["commandId"] = pending[draw(st.integers(0, len(pending) - 1))]
        events.append(event)
        job = next_state(job, event)
        record_fence(job, history)
    return events


@st.composite
def terminal_lifecycles(draw: st.DrawFn) -> list[Event]:
    """A lifecycle driven to a terminal state by one more receipt if it is not there yet."""
    events = draw(lifecycles())
    job = fold(to_receipts(events))
    assert job is not None
    if job.status == "queued":
        options: list[Event] = [
            ("job.canceled", {"reason": "user", "attempt": job.attempt}),
            ("job.failed", {"workerId": None, "attempt": job.attempt, "retryable": False}),
        ]
        events.append(draw(st.sampled_from(options)))
    elif job.lease is not None:
        fence = {"workerId": job.lease.worker_id, "attempt": job.lease.attempt}
        options = [
            ("job.completed", {**fence, "result": {"ok": True}}),
            ("job.failed", {**fence, "retryable": False, "status": "failed"}),
            ("job.canceled", {**fence, "reason": "abort"}),
        ]
        events.append(draw(st.sampled_from(options)))
    return events


# ---------------------------------------------------------------------------------------------
# Checks shared by the properties
# ---------------------------------------------------------------------------------------------


def first_fatal_index(events: Sequence[Event]) -> int | None:
    """Where folding must raise: the first receipt not ignored on a missing job, unless it
    creates the job."""
    for i, (kind, _) in enumerate(events):
        if kind in IGNORED_WHEN_MISSING:
            continue
        return None if kind == "job.enqueued" else i
    return None


def assert_consistent(job: Job) -> None:
    # (b) status always one of the six
    assert job.status in SIX_STATUSES
    assert set(STATUSES) == SIX_STATUSES
    # (e) attempt never exceeds max_attempts (and never goes negative)
    assert 0 <= job.attempt <= job.max_attempts
    # a queued job always has an attempt left: the next lease cannot pass max_attempts
    if job.status == "queued":
        assert job.attempt < job.max_attempts
    # the lease exists exactly while leased/running, and fences the current attempt
    assert (job.lease is not None) == (job.status in LEASED_STATUSES)
    if job.lease is not None:
        assert job.lease.attempt == job.attempt >= 1
    if job.status in TERMINAL_STATUSES:
        assert job.terminal and job.settled_at is not None
    else:
        assert not job.terminal and job.settled_at is None
    assert job.progress_count >= 0


def assert_inert(before: Job, after: Job | None, seq: int) -> None:
    assert after == before.model_copy(update={"seq": seq})


def step_through(events: Sequence[Event]) -> list[Job | None]:
    """Apply the receipts one at a time; return the state after each (asserting as it goes)."""
    states: list[Job | None] = []
    job: Job | None = None
    for receipt in to_receipts(events):
        before = job
        job = apply(job, receipt)
        if before is not None:
            assert job is not None
            assert job.seq == receipt.seq
            # (c) once terminal, nothing changes but `seq`
            if before.terminal:
                assert_inert(before, job, receipt.seq)
        if job is not None:
            assert_consistent(job)
        states.append(job)
    return states


# ---------------------------------------------------------------------------------------------
# (a) only the exact missing-job invariant, and only where the spec says
# ---------------------------------------------------------------------------------------------


@SETTINGS
@given(random_events())
def test_fold_raises_only_the_missing_job_invariant_where_due(events: list[Event]) -> None:
    fatal = first_fatal_index(events)
    job: Job | None = None
    for i, receipt in enumerate(to_receipts(events)):
        try:
            job = apply(job, receipt)
        except InvariantError as exc:
            assert str(exc) == no_job_message(JOB_ID) == f"Invariant: no job for {JOB_ID}"
            assert i == fatal, f"raised at {i}, expected at {fatal}"
            assert job is None
            with_fold_raises(events)
            return
    assert fatal is None, f"expected the invariant at receipt {fatal}"
    assert fold(to_receipts(events)) == job
    created = any(kind == "job.enqueued" for kind, _ in events)
    assert (job is not None) == created


def with_fold_raises(events: Sequence[Event]) -> None:
    try:
        fold(to_receipts(events))
    except InvariantError as exc:
        assert str(exc) == no_job_message(JOB_ID)
    else:
        raise AssertionError("fold must raise where apply did")


# ---------------------------------------------------------------------------------------------
# (b) six statuses, (c) terminal is final, (e) attempt <= max_attempts — on both generators
# ---------------------------------------------------------------------------------------------


@SETTINGS
@given(random_events())
def test_random_sequences_keep_the_invariants(events: list[Event]) -> None:
    fatal = first_fatal_index(events)
    if fatal is not None:
        events = events[:fatal]
    step_through(events)


@SETTINGS
@given(lifecycles())
def test_lifecycles_keep_the_invariants(events: list[Event]) -> None:
    """Lifecycles start with `job.enqueued`, so (a) also means: they never raise at all."""
    step_through(events)


@SETTINGS
@given(terminal_lifecycles(), st.lists(any_event(), min_size=1, max_size=10), st.data())
def test_terminal_state_never_changes_except_seq(
    events: list[Event], tail: list[Event], data: st.DataObject
) -> None:
    """Once a job is terminal, nothing appended after it (random receipts, and every type
    under each fence the job ever saw plus the system fence) moves anything but `seq`."""
    job = fold(to_receipts(events))
    assert job is not None and job.terminal
    fences = {(None, job.attempt), ("w1", job.attempt)}
    for _, body in events:
        if isinstance(body.get("attempt"), int):
            fences.add((body.get("workerId"), body["attempt"]))
    for fence in sorted(fences, key=repr):
        kind = data.draw(ALL_TYPES, label="type")
        tail.append((kind, data.draw(event_data(kind, fence), label="data")))
    for receipt in to_receipts(tail, start=job.seq + 1):
        after = apply(job, receipt)
        assert_inert(job, after, receipt.seq)
        assert after is not None
        job = after


# ---------------------------------------------------------------------------------------------
# (d) a write from a superseded attempt (attempt < job.attempt) never changes the state
# ---------------------------------------------------------------------------------------------

PROBE_TYPES = st.sampled_from(FENCED_TYPES)


@st.composite
def probed_lifecycles(draw: st.DrawFn) -> list[tuple[Job, Event]]:
    """A lifecycle where, after every receipt that leaves the job past attempt 0, a probe is
    drawn: a fenced receipt from an older attempt, under a workerId that really held that
    attempt, any worker, or none. (`job.canceled` without a workerId is the system cancel of a
    queued job, not an attempt's write, so its probes always carry a workerId.)"""
    events = draw(lifecycles())
    probes: list[tuple[Job, Event]] = []
    job: Job | None = None
    held: dict[int, list[str]] = {}
    for receipt in to_receipts(events):
        job = apply(job, receipt)
        assert job is not None
        if job.lease is not None:
            workers = held.setdefault(job.lease.attempt, [])
            if job.lease.worker_id not in workers:
                workers.append(job.lease.worker_id)
        if job.attempt < 1:
            continue
        stale = draw(st.integers(0, job.attempt - 1))
        kind = draw(PROBE_TYPES)
        candidates: list[str | None] = [*held.get(stale, []), *WORKERS]
        if kind != "job.canceled":
            candidates.append(None)
        worker = candidates[draw(st.integers(0, len(candidates) - 1))]
        probes.append((job, (kind, draw_data(draw, kind, (worker, stale)))))
    return probes


@SETTINGS
@given(probed_lifecycles())
def test_superseded_attempt_writes_are_inert(probes: list[tuple[Job, Event]]) -> None:
    for job, (kind, body) in probes:
        assert body["attempt"] < job.attempt
        seq = job.seq + 1
        probe = Receipt(STREAM, seq, kind, body, T0 + timedelta(seconds=seq))
        assert_inert(job, apply(job, probe), seq)


@st.composite
def superseded_scenarios(draw: st.DrawFn) -> tuple[list[Event], Event]:
    """A job taken through n >= 2 attempts the ordinary ways, then one write from attempt k < n."""
    max_attempts = draw(st.integers(2, 8))
    n = draw(st.integers(2, max_attempts))
    events: list[Event] = [("job.enqueued", draw(enqueued_data(st.just(max_attempts))))]
    workers: dict[int, list[str]] = {}
    for attempt in range(1, n + 1):
        worker = draw(st.sampled_from(WORKERS))
        workers[attempt] = [worker]
        events.append(("job.leased", {"workerId": worker, "attempt": attempt}))
        if draw(st.booleans()):
            events.append(("job.heartbeat", {"workerId": worker, "attempt": attempt}))
        if draw(st.booleans()):  # a redelivery takes the start fence
            other = draw(st.sampled_from(WORKERS))
            workers[attempt].append(other)
            data = {"workerId": other, "attempt": attempt, "startFence": True}
            events.append(("job.heartbeat", data))
            worker = other
        if attempt == n:
            break
        end = draw(st.sampled_from(("failed", "expired")))
        if end == "failed":
            events.append(
                ("job.failed", {"workerId": worker, "attempt": attempt, "retryable": True})
            )
        else:
            events.append(("job.lease_expired", {"workerId": worker, "attempt": attempt}))
    # optionally settle or abandon attempt n too: superseded writes stay inert either way
    finale = draw(st.sampled_from(("running", "completed", "failed", "expired", "queued")))
    last = workers[n][-1]
    if finale == "completed":
        events.append(("job.completed", {"workerId": last, "attempt": n, "result": None}))
    elif finale == "failed":
        events.append(("job.failed", {"workerId": last, "attempt": n, "retryable": False}))
    elif finale == "expired":
        events.append(("job.lease_expired", {"workerId": last, "attempt": n}))
    elif finale == "queued":
        data = {"workerId": last, "attempt": n, "retryable": True, "refundAttempt": True}
        events.append(("job.failed", data))
    stale = draw(st.integers(1, n - 1))
    kind = draw(st.sampled_from(FENCED_TYPES))
    worker = draw(st.sampled_from(workers[stale]))
    probe = (kind, draw_data(draw, kind, (worker, stale)))
    return events, probe


@SETTINGS
@given(superseded_scenarios())
def test_targeted_superseded_attempt_writes_are_inert(scenario: tuple[list[Event], Event]) -> None:
    events, probe = scenario
    job = fold(to_receipts(events))
    assert job is not None
    stale = probe[1]["attempt"]
    if stale >= job.attempt:
        # a refund of attempt n made attempt n-1 current again: not superseded any more
        assert probe[1]["attempt"] == job.attempt and job.status == "queued"
        return
    seq = job.seq + 1
    receipt = Receipt(STREAM, seq, probe[0], probe[1], T0 + timedelta(seconds=seq))
    assert_inert(job, apply(job, receipt), seq)


# ---------------------------------------------------------------------------------------------
# (f) fold == applying one by one; folding resumes from any stored state
# ---------------------------------------------------------------------------------------------


@SETTINGS
@given(st.one_of(lifecycles(), random_events()), st.data())
def test_fold_equals_applying_one_by_one(events: list[Event], data: st.DataObject) -> None:
    fatal = first_fatal_index(events)
    if fatal is not None:
        events = events[:fatal]
    receipts = to_receipts(events)
    job: Job | None = None
    for receipt in receipts:
        job = apply(job, receipt)
    assert fold(receipts) == job
    cut = data.draw(st.integers(0, len(receipts)), label="cut")
    prefix = fold(receipts[:cut])
    assert fold(receipts[cut:], prefix) == job
    # the projection stores `to_json()` and the store folds onward from the re-read state
    if prefix is not None:
        reloaded = Job.model_validate(prefix.to_json())
        assert reloaded == prefix
        assert fold(receipts[cut:], reloaded) == job
