"""An objective at its sizes: the most tasks it may hold, written and read through control."""

from __future__ import annotations

from typing import Any

from receipts import operations as ops
from receipts.enqueue import enqueue_in
from receipts.objectives import control
from receipts.objectives import store as objectives
from receipts.objectives.graph import MAX_TASKS, parse_tasks
from receipts.objectives.model import task_job_id
from receipts.store import Draft, Store
from tests.integration.helpers import create_objective

CONTROL = "factory.objective.control"
TASK = control.TASK_KIND


def phase_tasks(prefix: str) -> list[dict[str, Any]]:
    return [{"taskId": f"{prefix}{n}", "input": {"command": ["true"]}} for n in range(MAX_TASKS)]


async def dispatch_phase(store: Store, objective_id: str) -> None:
    """Every task of the objective's phase dispatched, as control dispatches each (its try's
    job and `objective.task.dispatched`), in one transaction."""
    state = await objectives.get(store, objective_id)
    assert state is not None
    async with store.transaction() as tx:
        for task in state.phase_tasks:
            payload = control.task_payload(state, task, 1)
            job_id = task_job_id(objective_id, task.task_id, 1)
            await enqueue_in(tx, control._request(state, task.agent_id, TASK, job_id, payload))
        await objectives.update(
            tx,
            objective_id,
            lambda _: [
                Draft(
                    "objective.task.dispatched",
                    {
                        "taskId": t.task_id,
                        "try": 1,
                        "jobId": task_job_id(objective_id, t.task_id, 1),
                    },
                )
                for t in state.phase_tasks
            ],
        )


async def test_a_pass_records_the_ends_of_two_full_phases_of_tries_at_once(
    fresh_store: Store,
) -> None:
    """Two phases of 200 tries, each ended (a cancel, or worker-control away while they ran)
    before control's next pass: that pass records 400 settlements in one append. Its NOTIFY
    named every receipt's type, past PostgreSQL's 8 000 bytes a notice ("payload string too
    long"): the pass failed, and every pass after it, so the objective never moved again."""
    store = fresh_store
    oid = "full-phases"
    await create_objective(store, oid, phase_tasks("a"))
    await dispatch_phase(store, oid)

    def phase_two(current: Any) -> list[Draft]:
        taken = {t.task_id: t.phase for t in current.tasks}
        tasks = parse_tasks(phase_tasks("b"), "t", taken)
        return [Draft("objective.phase_added", {"phase": 2, "tasks": [t.to_json() for t in tasks]})]

    async with store.transaction() as tx:
        await objectives.update(tx, oid, phase_two)
    await dispatch_phase(store, oid)
    state = await objectives.get(store, oid)
    assert state is not None
    tries = state.active_job_ids()
    assert len(tries) == 2 * MAX_TASKS
    for job_id in tries:  # ended while control was away (here: canceled before they ran)
        assert (await ops.cancel_queued(store, job_id, reason="stop")).ok

    _, decided = await control.run_pass(store, oid, CONTROL)

    assert len(decided.records) == 2 * MAX_TASKS
    now = await objectives.get(store, oid)
    assert now is not None and now.active_job_ids() == []
    assert {t.status for t in now.tasks} == {"canceled"}
