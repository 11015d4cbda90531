"""Objective control's fan-out is held to the organization's caps of open jobs, as an enqueue is:
a ready task its organization has no room for stays pending, and a later pass dispatches it once
room is made. A task's try is watched by a monitor, so each dispatch takes two places."""

from __future__ import annotations

from activities.fence import AttemptFence
from activities.handlers.context import HandlerContext, HandlerSettings
from activities.handlers.factory import objective_control
from activities.handlers.fenced import FencedReceipts
from receipts import metrics
from receipts import operations as ops
from receipts.enqueue import EnqueueRequest, OrgCaps, enqueue
from receipts.objectives import control
from receipts.objectives import store as objectives
from receipts.objectives.model import monitor_job_id, task_job_id
from receipts.store import Store
from receipts.timing import lease_ms
from roles.infra.settings import load
from tests.integration.helpers import create_objective, put

CONTROL = "factory.objective.control"
TASKS = [{"taskId": f"t{n}", "input": {"command": ["true"]}} for n in range(4)]


async def plain_job(store: Store, job_id: str, org: str) -> None:
    request = EnqueueRequest(
        agent_id="codex", payload={}, kind="codex.run", organization_id=org, job_id=job_id
    )
    await enqueue(store, request)


async def test_dispatch_stops_at_the_caps_and_a_later_pass_dispatches_the_rest(
    fresh_store: Store,
) -> None:
    store = fresh_store
    await plain_job(store, "other-1", "org-c")
    await plain_job(store, "other-2", "org-c")
    await plain_job(store, "elsewhere", "org-d")  # another organization's: not counted
    await create_objective(store, "capped", TASKS, org="org-c")
    caps = OrgCaps(max_queued=5, max_active=100)
    held_before = metrics.value("receipt_factory_tasks_held_total")

    # Two queued jobs leave room for three: one try and its monitor, not a second pair.
    result = await control.reconcile(store, "capped", CONTROL, caps=caps)
    assert result.dispatched == ["t0"]
    assert result.held == ["t1", "t2", "t3"]
    assert result.passes == 2  # the pass that only held tasks was the quiet one
    assert await store.get_job(task_job_id("capped", "t1", 1)) is None
    assert await store.get_job(monitor_job_id("capped", "t1", 1)) is None
    state = await objectives.get(store, "capped")
    assert state is not None
    assert [t.status for t in state.tasks] == ["dispatched", "pending", "pending", "pending"]
    assert metrics.value("receipt_factory_tasks_held_total") == held_before + 3 + 3

    # Room is made (the organization's other jobs end): the next pass dispatches up to it.
    for job_id in ("other-1", "other-2"):
        await ops.cancel_queued(store, job_id, reason="done")
    again = await control.reconcile(store, "capped", CONTROL, caps=caps)
    assert again.dispatched == ["t1"]
    assert again.held == ["t2", "t3"]

    # Without caps (a runtime that reads none) every ready task is dispatched.
    rest = await control.reconcile(store, "capped", CONTROL)
    assert rest.dispatched == ["t2", "t3"] and rest.held == []


async def test_the_active_cap_holds_as_the_queued_one_does(fresh_store: Store) -> None:
    store = fresh_store
    # Two open jobs: one stands for the control job that runs the pass in production (the pass
    # does not count its own), the other holds the organization's last active place.
    await plain_job(store, "busy", "org-e")
    await plain_job(store, "busier", "org-e")
    await create_objective(store, "active-capped", TASKS[:2], org="org-e")
    result = await control.reconcile(
        store, "active-capped", CONTROL, caps=OrgCaps(max_queued=100, max_active=2)
    )
    assert result.dispatched == [] and result.held == ["t0", "t1"]
    state = await objectives.get(store, "active-capped")
    assert state is not None and state.status == "active"
    assert all(t.status == "pending" for t in state.tasks)


async def test_the_control_handler_holds_dispatch_to_its_process_caps(fresh_store: Store) -> None:
    """The worker's control jobs are handed the caps its process read (`HandlerSettings`), the
    api's variables (roles/infra/settings.py)."""
    store = fresh_store
    await create_objective(store, "handled", TASKS[:3], org="org-f")
    job = (
        await put(
            store,
            "factory-control",
            kind=CONTROL,
            org="org-f",
            payload_extra={"objectiveId": "handled"},
        )
    ).job
    fence = AttemptFence(store, job.job_id, attempt=1, worker_id=f"{job.job_id}:attempt:1/1")
    out = await fence.start(60_000, {"role": "test"})
    assert out.ok and out.job is not None
    caps = load({"RECEIPT_ORG_MAX_QUEUED": "5"}).handlers.org_caps
    assert caps == OrgCaps(max_queued=5, max_active=2000, max_timeout_ms=3_600_000)
    ctx = HandlerContext(
        job=out.job,
        attempt=1,
        worker_id=fence.worker_id,
        receipts=FencedReceipts(fence, out.job.session_key, "org-f"),
        settings=HandlerSettings(org_caps=caps),
    )
    # Five queued places (the running control job is not one): two tries with their monitors,
    # and the third waits.
    result = await objective_control(ctx)
    assert result["dispatched"] == ["t0", "t1"] and result["held"] == ["t2"]


async def test_a_tasks_timeout_is_clamped_to_the_operators_cap_as_a_posted_jobs_is(
    fresh_store: Store,
) -> None:
    """README, *Limits*: `RECEIPT_MAX_TIMEOUT_MS` clamps a payload's `timeoutMs` (a job cannot
    hold a worker slot for longer). A task's try is a `factory.task.run` job as a posted one is:
    the control handler holds its `timeoutMs` to the cap its process read, so wrapping a task in
    an objective does not buy the hour-long lease a posted job is refused."""
    store = fresh_store
    tasks = [{"taskId": "t", "input": {"command": ["true"]}, "timeoutMs": 3_000_000}]
    await create_objective(store, "long-task", tasks, org="org-h")
    job = (
        await put(
            store,
            "factory-control",
            kind=CONTROL,
            org="org-h",
            payload_extra={"objectiveId": "long-task"},
        )
    ).job
    fence = AttemptFence(store, job.job_id, attempt=1, worker_id=f"{job.job_id}:attempt:1/1")
    out = await fence.start(60_000, {"role": "test"})
    assert out.ok and out.job is not None
    handlers = load({"RECEIPT_MAX_TIMEOUT_MS": "60000"}).handlers
    ctx = HandlerContext(
        job=out.job,
        attempt=1,
        worker_id=fence.worker_id,
        receipts=FencedReceipts(fence, out.job.session_key, "org-h"),
        settings=handlers,
    )
    result = await objective_control(ctx)
    assert result["dispatched"] == ["t"]
    task = await store.get_job(task_job_id("long-task", "t", 1))
    assert task is not None and task.payload["timeoutMs"] == 60_000
    timing = load({}).timing
    assert lease_ms(task.agent_id, task.payload, timing) == timing.codex_job_lease_ms  # 15 min


async def test_caps_too_small_for_a_try_and_its_monitor_still_let_one_through(
    fresh_store: Store,
) -> None:
    """A try and its monitor take two places: under `RECEIPT_ORG_MAX_QUEUED=1` no dispatch ever
    fitted, and the objective waited for ever. An organization with no other open job gets one."""
    store = fresh_store
    await create_objective(store, "tiny", TASKS[:2], org="org-g")
    first = await control.reconcile(
        store, "tiny", CONTROL, caps=OrgCaps(max_queued=1, max_active=1)
    )
    assert first.dispatched == ["t0"] and first.held == ["t1"]


async def test_the_pass_does_not_count_its_own_control_job_against_the_active_cap(
    fresh_store: Store,
) -> None:
    """The control job running the pass takes no place (docs/factory.md): with two open jobs,
    one standing for it, an active cap of 3 leaves room for one try and its monitor."""
    store = fresh_store
    await plain_job(store, "control-stand-in", "org-h")
    await plain_job(store, "other", "org-h")
    await create_objective(store, "own-place", TASKS[:2], org="org-h")
    result = await control.reconcile(
        store, "own-place", CONTROL, caps=OrgCaps(max_queued=100, max_active=3)
    )
    assert result.dispatched == ["t0"] and result.held == ["t1"]


async def test_a_phase_dispatched_to_a_settled_objective_fails_and_writes_nothing(
    fresh_store: Store,
) -> None:
    """`factory.dispatch` adds a phase to a *live* objective: one already settled refuses it,
    non-retryably, and its stream is left as it was."""
    from activities.handlers.context import HandlerError
    from activities.handlers.factory import factory_dispatch

    store = fresh_store
    await create_objective(store, "settled", TASKS[:1], org="org-i")
    async with store.transaction() as tx:
        await objectives.request_cancel(tx, "settled", "stop")
    await control.reconcile(store, "settled", CONTROL)
    before = await objectives.get(store, "settled")
    assert before is not None and before.status == "canceled"
    job = (
        await put(
            store,
            "factory",
            kind="factory.dispatch",
            org="org-i",
            payload_extra={"objectiveId": "settled", "tasks": TASKS[1:2]},
        )
    ).job
    fence = AttemptFence(store, job.job_id, attempt=1, worker_id=f"{job.job_id}:attempt:1/1")
    out = await fence.start(60_000, {"role": "test"})
    assert out.ok and out.job is not None
    ctx = HandlerContext(
        job=out.job,
        attempt=1,
        worker_id=fence.worker_id,
        receipts=FencedReceipts(fence, out.job.session_key, "org-i"),
        settings=HandlerSettings(),
    )
    try:
        await factory_dispatch(ctx)
    except HandlerError as exc:
        assert exc.retryable is False and "is canceled" in str(exc)
    else:
        raise AssertionError("a phase was dispatched to a settled objective")
    after = await objectives.get(store, "settled")
    assert after is not None and after.seq == before.seq
