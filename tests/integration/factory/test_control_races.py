"""Objective control against a write that lands between its read and its own write (a phase
added by `factory.dispatch` on worker-chat while control runs on worker-control): the pass writes
nothing planned on the state it read, and the next one plans on the objective as it is."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from activities.handlers.context import HandlerError
from activities.handlers.factory import objective_audit
from receipts import metrics
from receipts.objectives import control
from receipts.objectives import store as objectives
from receipts.objectives.graph import parse_tasks
from receipts.objectives.model import ObjectiveState, step_job_id, task_job_id
from receipts.store import Draft, Store, Tx
from tests.integration.helpers import create_objective, put, started_context

CONTROL = "factory.objective.control"
TASK_LIST = [{"taskId": "t", "input": {"command": ["true"]}}]


_BEFORE_LOCK: list[Callable[[str], Awaitable[None]]] = []


@pytest.fixture(autouse=True)
def writes_before_the_lock(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A pass that writes jobs takes the objective's lock before them (`lock_objective`, the
    lock order); the other writer of `first_write` commits just before that lock too."""
    real = objectives.lock_objective

    async def lock(tx: Tx, objective_id: str, guard: objectives.Guard | None = None) -> None:
        for before in list(_BEFORE_LOCK):
            await before(objective_id)
        await real(tx, objective_id, guard)

    monkeypatch.setattr(objectives, "lock_objective", lock)
    yield
    _BEFORE_LOCK.clear()


def first_write(action: Callable[[str], Awaitable[object]]) -> objectives.Guard:
    """A guard that, the first time the pass writes the objective, runs `action(objective_id)`
    (another writer, in its own transactions), just before the pass takes the objective's lock
    (its `lock_objective` before a job write, or its write's own)."""
    done = False

    async def once(objective_id: str) -> None:
        nonlocal done
        if not done:
            done = True
            await action(objective_id)

    _BEFORE_LOCK.append(once)

    async def guard(tx: Tx, objective_id: str) -> None:
        await once(objective_id)

    return guard


def committing_first(store: Store, decide: objectives.Decide) -> objectives.Guard:
    """`first_write` of a write of the objective that `decide` chooses."""

    async def commit(objective_id: str) -> None:
        async with store.transaction() as other:
            await objectives.update(other, objective_id, decide)

    return first_write(commit)


def adding_a_phase_first(store: Store, task_id: str) -> objectives.Guard:
    """A guard committing `objective.phase_added` (the next phase, one task `task_id`) before
    the pass's first write."""

    def phase(current: Any) -> list[Draft]:
        taken = {t.task_id: t.phase for t in current.tasks}
        tasks = parse_tasks([{"taskId": task_id, "input": {"command": ["true"]}}], "t", taken)
        data = {"phase": current.phase + 1, "tasks": [t.to_json() for t in tasks]}
        return [Draft("objective.phase_added", data)]

    return committing_first(store, phase)


async def test_a_dispatch_planned_before_a_new_phase_leaves_no_job_behind(
    fresh_store: Store,
) -> None:
    store = fresh_store
    await create_objective(store, "race-d", [{"taskId": "x", "input": {"command": ["true"]}}])
    stale = metrics.value("receipt_factory_control_stale_plans_total")
    state, decided = await control.run_pass(
        store, "race-d", CONTROL, adding_a_phase_first(store, "z")
    )
    assert state is not None and [t.task_id for t in decided.dispatch] == ["x"]
    # x was superseded before its dispatch was recorded: its job is rolled back with it.
    assert await store.get_job(task_job_id("race-d", "x", 1)) is None
    now = await objectives.get(store, "race-d")
    assert now is not None and now.phase == 2
    assert now.task("x").status == "canceled"  # type: ignore[union-attr]
    assert metrics.value("receipt_factory_control_stale_plans_total") == stale + 1
    # The next pass plans on the objective as it is: phase 2's task.
    _, again = await control.run_pass(store, "race-d", CONTROL)
    assert [t.task_id for t in again.dispatch] == ["z"]
    assert await store.get_job(task_job_id("race-d", "z", 1)) is not None


async def test_a_settle_planned_before_a_new_phase_leaves_the_objective_open(
    fresh_store: Store,
) -> None:
    store = fresh_store
    await create_objective(store, "race-s", [{"taskId": "x", "input": {"command": ["true"]}}])
    job_id = task_job_id("race-s", "x", 1)
    async with store.transaction() as tx:
        await objectives.update(
            tx,
            "race-s",
            lambda _: [
                Draft("objective.task.dispatched", {"taskId": "x", "try": 1, "jobId": job_id}),
                Draft(
                    "objective.task.settled",
                    {"taskId": "x", "try": 1, "jobId": job_id, "status": "completed"},
                ),
            ],
        )
    state, decided = await control.run_pass(
        store, "race-s", CONTROL, adding_a_phase_first(store, "z")
    )
    assert state is not None and decided.settle == {"status": "completed"}
    now = await objectives.get(store, "race-s")
    assert now is not None and now.status == "active" and now.phase == 2
    assert now.task("z").status == "pending"  # type: ignore[union-attr]
    # Its next pass runs phase 2 instead of the objective ending with it never started.
    _, again = await control.run_pass(store, "race-s", CONTROL)
    assert [t.task_id for t in again.dispatch] == ["z"]


def cancelling_first(store: Store) -> objectives.Guard:
    """A guard committing the objective's cancel request (as `POST /objectives/{id}/cancel`
    does) before the pass's first write."""
    return committing_first(
        store, lambda _: [Draft("objective.cancel_requested", {"reason": "stop"})]
    )


async def test_a_dispatch_planned_before_a_cancel_leaves_no_job_behind(
    fresh_store: Store,
) -> None:
    """A task's dispatch was re-decided under the lock on its task alone: planned before a
    cancel, it was recorded and its job enqueued after the cancel (and onto an objective that
    another pass had settled `canceled`, a job nothing would ever abort). It writes nothing now;
    the next pass plans the cancel."""
    store = fresh_store
    await create_objective(store, "race-c", [{"taskId": "x", "input": {"command": ["true"]}}])
    state, decided = await control.run_pass(store, "race-c", CONTROL, cancelling_first(store))
    assert state is not None and [t.task_id for t in decided.dispatch] == ["x"]
    assert await store.get_job(task_job_id("race-c", "x", 1)) is None
    now = await objectives.get(store, "race-c")
    assert now is not None and now.cancel_requested
    assert now.task("x").status == "pending"  # type: ignore[union-attr]
    _, again = await control.run_pass(store, "race-c", CONTROL)
    assert again.dispatch == () and again.settle is not None  # settles canceled
    assert await store.get_job(task_job_id("race-c", "x", 1)) is None


async def test_an_objective_whose_audit_job_ended_without_auditing_is_audited_by_the_redrive(
    fresh_store: Store,
) -> None:
    """The audit job is enqueued once, in the settling transaction: aborted, or out of its
    attempts, it left the objective unaudited for good, and its event stream (and `--wait`)
    never ended. The outbox redrive audits it as the job would have, once."""
    from receipts import operations as ops
    from receipts.objectives.model import audit_job_id
    from roles.api.routes.objectives import followed_objective

    store = fresh_store
    await create_objective(store, "lost-a", [{"taskId": "x", "input": {"command": ["true"]}}])
    async with store.transaction() as tx:
        await objectives.request_cancel(tx, "lost-a", "stop")
    await control.run_pass(store, "lost-a", CONTROL)
    settled = await objectives.get(store, "lost-a")
    assert settled is not None and settled.status == "canceled"
    assert settled.audit_job_id == audit_job_id("lost-a") and settled.audit is None
    assert (await ops.cancel_queued(store, audit_job_id("lost-a"), reason="tenant")).ok
    recovered = metrics.value("receipt_factory_audits_recovered_total")
    assert followed_objective("lost-a").end(settled) is None  # the stream waits for the audit
    assert await objectives.recover_lost_audits(store) == 1
    audited = await objectives.get(store, "lost-a")
    assert audited is not None and audited.audit is not None
    assert audited.audit["totals"]["tasks"] == 1
    assert followed_objective("lost-a").end(audited) == {
        "objectiveId": "lost-a",
        "status": "canceled",
    }
    assert metrics.value("receipt_factory_audits_recovered_total") == recovered + 1
    assert await objectives.recover_lost_audits(store) == 0  # once


async def test_each_watchdog_tick_reads_the_next_window_of_active_objectives(
    fresh_store: Store,
) -> None:
    """The watchdog reads at most its scan limit of active objectives, oldest first: a healthy
    objective quietly running a long task never changes, so it stayed among the oldest and an
    objective behind the limit was never looked at (scan limit 1: three ticks read the same
    one). Each tick reads a window chosen by its id."""
    from receipts.objectives.watchdog import tick_of

    store = fresh_store
    for name in ("win-a", "win-b", "win-c"):
        await create_objective(store, name, [{"taskId": "x", "input": {"command": ["true"]}}])
    seen = []
    for tick in range(6):
        states, now = await objectives.active(store, 1, tick)
        assert now is not None and len(states) == 1
        seen.append(states[0].objective_id)
    assert seen[:3] == ["win-a", "win-b", "win-c"] and seen[3:] == seen[:3]
    everything, _ = await objectives.active(store, 200, tick_of("watchdog:2026-12-06T09:51:00Z"))
    assert [s.objective_id for s in everything] == ["win-a", "win-b", "win-c"]
    # A tick's window is a hash of its id: the same for a retried tick, and every window is read
    # whatever the cron (by the minute, a cron of every 3 minutes read window 0 of 3 only).
    every_3_minutes = [f"watchdog:2026-12-06T{h:02d}:{m:02d}:00Z" for h in range(4) for m in (0, 3)]
    assert tick_of(every_3_minutes[0]) == tick_of(every_3_minutes[0])
    assert {tick_of(t) % 3 for t in every_3_minutes} == {0, 1, 2}


def settled(task_id: str, job_id: str, status: str) -> list[Draft]:
    """A try of `task_id` dispatched as `job_id` and recorded `status`."""
    return [
        Draft("objective.task.dispatched", {"taskId": task_id, "try": 1, "jobId": job_id}),
        Draft(
            "objective.task.settled",
            {"taskId": task_id, "try": 1, "jobId": job_id, "status": status, "error": "x"},
        ),
    ]


async def test_a_settle_planned_before_another_pass_dispatched_a_task_aborts_it_first(
    fresh_store: Store,
) -> None:
    """A second control pass (a control job posted or retried by hand beside the singleton one)
    dispatched `c` after this pass read the objective: the pass's plan, `failed` with nothing
    running, must not settle it and leave c's job running unrecorded."""
    store = fresh_store
    oid = "race-f"
    tasks = [
        {"taskId": "a", "input": {"command": ["true"]}, "maxAttempts": 1},
        {"taskId": "d", "input": {"command": ["true"]}},
        {"taskId": "c", "input": {"command": ["true"]}, "dependsOn": ["d"]},
    ]
    await create_objective(store, oid, tasks)
    async with store.transaction() as tx:
        await objectives.update(
            tx,
            oid,
            lambda _: [
                *settled("d", task_job_id(oid, "d", 1), "completed"),
                *settled("a", task_job_id(oid, "a", 1), "failed"),
            ],
        )

    async def another_pass_dispatches_c(objective_id: str) -> None:
        read = await objectives.get(store, objective_id)
        assert read is not None and read.task("c") is not None
        await control._dispatch_task(store, read, read.task("c"), None, None)  # type: ignore[arg-type]

    guard = first_write(another_pass_dispatches_c)
    state, decided = await control.run_pass(store, oid, CONTROL, guard)
    assert state is not None and decided.settle is not None and decided.settle["status"] == "failed"
    now = await objectives.get(store, oid)
    assert now is not None and now.status == "active", now.status
    c_job = task_job_id(oid, "c", 1)
    assert now.task("c").status == "dispatched"  # type: ignore[union-attr]
    # The next pass sees c running: it aborts it, then settles once it is recorded.
    _, again = await control.run_pass(store, oid, CONTROL)
    assert [job_id for job_id, _ in again.aborts] == [c_job]
    assert again.settle is None


async def test_a_step_planned_in_an_earlier_phase_is_not_dispatched_in_a_later_one(
    fresh_store: Store,
) -> None:
    """The pass read phase 1 with validate due; meanwhile validate ran for phase 1, a phase was
    added and its task completed, so validate is due again. The stale pass's job id names phase
    1 (a completed job): recorded for phase 2, the objective would complete unvalidated."""
    store = fresh_store
    oid = "race-v"
    await create_objective(store, oid, validate={"command": ["true"]})
    async with store.transaction() as tx:
        await objectives.update(
            tx, oid, lambda _: settled("t", task_job_id(oid, "t", 1), "completed")
        )
    v1 = step_job_id(oid, "validate", 1)

    def validate_ran_and_a_phase_came(current: Any) -> list[Draft]:
        taken = {t.task_id: t.phase for t in current.tasks}
        tasks = parse_tasks([{"taskId": "z", "input": {"command": ["true"]}}], "t", taken)
        return [
            Draft("objective.step.dispatched", {"step": "validate", "jobId": v1, "phase": 1}),
            Draft(
                "objective.step.settled",
                {"step": "validate", "jobId": v1, "status": "completed", "error": None},
            ),
            Draft("objective.phase_added", {"phase": 2, "tasks": [t.to_json() for t in tasks]}),
            *settled("z", task_job_id(oid, "z", 1), "completed"),
        ]

    guard = committing_first(store, validate_ran_and_a_phase_came)
    state, decided = await control.run_pass(store, oid, CONTROL, guard)
    assert state is not None and state.phase == 1 and decided.step == "validate"
    now = await objectives.get(store, oid)
    assert now is not None and now.phase == 2 and now.validate_step is not None
    assert now.validate_step.status == "pending", now.validate_step
    # The next pass dispatches phase 2's validate, a job of its own.
    _, again = await control.run_pass(store, oid, CONTROL)
    assert again.step == "validate"
    now = await objectives.get(store, oid)
    assert now is not None and now.validate_step is not None
    assert now.validate_step.job_id == step_job_id(oid, "validate", 2)


async def test_an_audit_job_of_an_objective_not_settled_writes_nothing(
    fresh_store: Store,
) -> None:
    """Its one audit is of the settled objective: an audit job posted (or retried) while it is
    active would take the audit's place, and the settled one would never be written."""
    store = fresh_store
    await create_objective(store, "early-audit")
    job = (
        await put(
            store,
            "factory-control",
            kind="factory.objective.audit",
            payload_extra={"objectiveId": "early-audit"},
        )
    ).job
    ctx = await started_context(store, job.job_id)
    with pytest.raises(HandlerError, match="audited once settled") as refused:
        await objective_audit(ctx)
    assert refused.value.retryable is False
    now = await objectives.get(store, "early-audit")
    assert isinstance(now, ObjectiveState) and now.audit is None


async def test_a_run_job_aborted_as_it_creates_the_objective_cancels_it(
    fresh_store: Store,
) -> None:
    """The api found no objective to cancel and aborted its run job, which was creating it:
    the objective it creates is canceled by the control pass its creation requested, in the
    same transaction (the cancel was lost and it ran anyway; a handler honouring it after the
    creation lost it when its worker died in between)."""
    import dataclasses

    from activities.handlers.factory import factory_run
    from receipts import operations as ops
    from receipts.enqueue import enqueue, parse_enqueue
    from receipts.objectives.model import run_job_id
    from tests.integration.helpers import body

    store = fresh_store
    objective = {"objectiveId": "abort-run", "title": "t", "goal": "g", "tasks": TASK_LIST}
    parsed = parse_enqueue(
        "factory",
        body(
            kind="factory.run", payload_extra={"objectiveId": "abort-run", "objective": objective}
        ),
    )
    run = (await enqueue(store, dataclasses.replace(parsed, job_id=run_job_id("abort-run")))).job
    ctx = await started_context(store, run.job_id)
    aborted = await ops.add_command(
        store, run.job_id, type="abort", reason="changed my mind", check_organization=False
    )
    assert aborted.ok
    await factory_run(ctx)  # its worker may die now: what follows is control's
    created = await objectives.get(store, "abort-run")
    assert created is not None and created.needs_reconcile and not created.cancel_requested
    state, decided = await control.run_pass(store, "abort-run", CONTROL)
    assert state is not None and state.cancel_requested
    assert state.cancel_reason == "changed my mind"
    assert decided.dispatch == () and decided.settle == {
        "status": "canceled",
        "error": "changed my mind",
    }
    settled = await objectives.get(store, "abort-run")
    assert settled is not None and settled.status == "canceled"
