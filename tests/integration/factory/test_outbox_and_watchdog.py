"""The control outbox (atomic with the job's terminal receipt, healed by the redrive), the
startup resume and the watchdog's scan."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from temporalio.client import Client

from activities.handlers.context import HandlerContext, HandlerSettings
from activities.handlers.factory import objective_watchdog
from receipts import metrics
from receipts import operations as ops
from receipts.enqueue import enqueue, parse_enqueue
from receipts.errors import StorageError
from receipts.jobs import Job
from receipts.objectives import metrics as factory_metrics
from receipts.objectives import store as objectives
from receipts.objectives.model import ObjectiveState, objective_stream, session_key, task_job_id
from receipts.objectives.watchdog import WatchdogSettings, tick_of
from receipts.store import Draft, Store
from roles.delivery.loops import ObjectiveResume
from tests.integration.delivery.conftest import running_stack
from tests.integration.factory.conftest import AUTH, outbox_running, run_objective, wait_objective
from tests.integration.helpers import create_objective, put, started_context

FAIL_REQUESTS = """
CREATE FUNCTION refuse_control_requests() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.type = 'objective.control_requested' THEN
    RAISE EXCEPTION 'injected failure between the terminal receipt and its control request';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER refuse_control_requests BEFORE INSERT ON receipts
  FOR EACH ROW EXECUTE FUNCTION refuse_control_requests();
"""


async def running_task_job(store: Store, objective_id: str) -> tuple[Job, str]:
    body = {
        "payload": {
            "kind": "factory.task.run",
            "objectiveId": objective_id,
            "authContext": AUTH,
            "input": {"command": ["true"]},
        },
    }
    # The id the runtime gives the objective's task (callers may not choose `objective:` ids).
    request = parse_enqueue("codex", body)
    named = dataclasses.replace(request, job_id=task_job_id(objective_id, "t", 1))
    job = (await enqueue(store, named)).job
    worker = f"{job.job_id}:attempt:1/1"
    out = await ops.start_attempt(store, job.job_id, attempt=1, worker_id=worker, lease_ms=60_000)
    assert out.ok
    return job, worker


TASK = [{"taskId": "t", "input": {"command": ["true"]}}]


async def test_a_terminal_receipt_and_its_control_request_commit_together_or_not_at_all(
    fresh_store: Store, fresh_db: str
) -> None:
    await create_objective(fresh_store, "obx-1", TASK)
    job, worker = await running_task_job(fresh_store, "obx-1")
    before = await fresh_store.read_stream(objective_stream("obx-1"))
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await conn.execute(FAIL_REQUESTS.encode())
    with pytest.raises(StorageError, match="injected failure"):
        await ops.complete(fresh_store, job.job_id, worker_id=worker, attempt=1, result={})
    # Neither: the job is still running and the objective's stream is unchanged.
    still = await fresh_store.get_job(job.job_id)
    assert still is not None and still.status == "running"
    assert await fresh_store.read_stream(objective_stream("obx-1")) == before
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await conn.execute(b"DROP TRIGGER refuse_control_requests ON receipts")
    out = await ops.complete(fresh_store, job.job_id, worker_id=worker, attempt=1, result={})
    assert out.ok
    # Both: the terminal receipt and the request, in one transaction (same recorded time).
    terminal = (await fresh_store.read_stream(f"jobs/{job.job_id}"))[-1]
    request = (await fresh_store.read_stream(objective_stream("obx-1")))[-1]
    assert (terminal.type, request.type) == ("job.completed", "objective.control_requested")
    assert request.data["jobId"] == job.job_id
    assert terminal.recorded_at == request.recorded_at
    state = await objectives.get(fresh_store, "obx-1")
    assert state is not None and state.control_pending


async def test_an_expired_lease_requests_control_in_the_same_transaction(
    fresh_store: Store,
) -> None:
    await create_objective(fresh_store, "obx-2", TASK)
    job, worker = await running_task_job(fresh_store, "obx-2")
    await ops.heartbeat(fresh_store, job.job_id, worker_id=worker, attempt=1, lease_ms=1)
    await asyncio.sleep(0.05)
    out = await ops.expire_lease(fresh_store, job.job_id)
    assert out.ok
    expired = (await fresh_store.read_stream(f"jobs/{job.job_id}"))[-1]
    request = (await fresh_store.read_stream(objective_stream("obx-2")))[-1]
    assert expired.type == "job.lease_expired"
    assert request.type == "objective.control_requested"
    assert request.data["reason"] == "lease_expired"
    assert expired.recorded_at == request.recorded_at


async def test_a_job_without_an_objective_writes_no_request(fresh_store: Store) -> None:
    job, worker = await running_task_job(fresh_store, "nowhere")
    assert (await ops.complete(fresh_store, job.job_id, worker_id=worker, attempt=1)).ok
    assert await fresh_store.read_stream(objective_stream("nowhere")) == []


async def test_the_outbox_redrive_delivers_a_request_left_after_a_crash(
    fresh_store: Store,
) -> None:
    await create_objective(fresh_store, "obx-3", TASK)
    job, worker = await running_task_job(fresh_store, "obx-3")
    assert (await ops.complete(fresh_store, job.job_id, worker_id=worker, attempt=1)).ok
    # Nothing delivered it (the process "crashed" after the commit): the outbox pass does.
    assert await objectives.outbox_candidates(fresh_store, 10) == ["obx-3"]
    assert await objectives.redrive_outbox(fresh_store) == 1
    state = await objectives.get(fresh_store, "obx-3")
    assert state is not None and not state.control_pending
    control = await fresh_store.get_job(state.control_job_id or "")
    assert control is not None
    assert (control.kind, control.session_key, control.status) == (
        "factory.objective.control",
        session_key("obx-3"),
        "queued",
    )
    # Delivered once: a second pass finds nothing (the control job is active).
    assert await objectives.outbox_candidates(fresh_store, 10) == []


POISON_CONTROL_JOB = """
CREATE FUNCTION refuse_poison_control() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.type = 'job.enqueued' AND NEW.stream LIKE '%%obx-poison%%' THEN
    RAISE EXCEPTION 'injected failure of one objective''s control job';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER refuse_poison_control BEFORE INSERT ON receipts
  FOR EACH ROW EXECUTE FUNCTION refuse_poison_control();
"""


async def test_an_objective_whose_delivery_fails_holds_back_no_other(fresh_store: Store) -> None:
    """One objective whose control job could not be written raised out of the outbox pass:
    every objective after it in the pass (and the lost-audit recovery after the pass) waited
    for as long as that one kept failing. The others are delivered; the pass then fails."""
    for objective_id in ("obx-poison", "obx-next"):
        await create_objective(fresh_store, objective_id, TASK)
        job, worker = await running_task_job(fresh_store, objective_id)
        assert (await ops.complete(fresh_store, job.job_id, worker_id=worker, attempt=1)).ok
    assert await objectives.outbox_candidates(fresh_store, 10) == ["obx-poison", "obx-next"]
    async with fresh_store.connection() as conn:
        await conn.execute(POISON_CONTROL_JOB)
    undelivered = factory_metrics.FACTORY_OUTBOX_UNDELIVERED._value.get()
    with pytest.raises(StorageError, match="one objective's control job"):
        await objectives.redrive_outbox(fresh_store)
    assert await objectives.outbox_candidates(fresh_store, 10) == ["obx-poison"]
    delivered = await objectives.get(fresh_store, "obx-next")
    assert delivered is not None and not delivered.control_pending
    assert factory_metrics.FACTORY_OUTBOX_UNDELIVERED._value.get() == undelivered + 1


async def test_an_objective_left_without_its_outbox_completes_once_the_redrive_runs(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    objective = {
        "objectiveId": "heal-1",
        "title": "heal",
        "goal": "completes after the outbox comes back",
        "tasks": [{"taskId": "t", "input": {"command": ["true"]}}],
    }
    async with running_stack(client, fresh_store, fresh_db) as stack:
        await run_objective(fresh_store, objective)
        for _ in range(600):  # the task settles; its request waits in the outbox
            state = await objectives.get(fresh_store, "heal-1")
            if state and state.control_pending and state.tasks[0].tries:
                job = await fresh_store.get_job(state.tasks[0].tries[0].job_id)
                if job and job.terminal:
                    break
            await asyncio.sleep(0.05)
        assert state is not None and state.status == "active"
        async with outbox_running(stack):
            done = await wait_objective(fresh_store, "heal-1")
    assert done.status == "completed"


async def test_startup_resume_requests_control_for_a_quiet_active_objective(
    fresh_store: Store,
) -> None:
    await create_objective(fresh_store, "res-1", TASK)
    resume = ObjectiveResume(fresh_store)
    assert await resume.run_once() == 1
    state = await objectives.get(fresh_store, "res-1")
    assert state is not None and state.last_control_reason == "resume"
    assert state.control_job_id is not None
    # An objective with an active control job (or a pending request) is left alone.
    assert await resume.run_once() == 0


async def test_a_failed_startup_resume_is_counted_and_tried_again_until_it_succeeds(
    fresh_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database away as the role starts: the resume pass fails twice, each failure counted
    (so the loop-failure alert can see them), and the third try resumes the objective. It ran
    once: one failure left the objective to the watchdog and could never reach the alert."""
    await create_objective(fresh_store, "res-retry", TASK)
    real = objectives.resume_candidates
    calls = 0

    async def away_twice(store: Store, limit: int) -> list[str]:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise StorageError("connection refused")
        return await real(store, limit)

    monkeypatch.setattr(objectives, "resume_candidates", away_twice)
    failed = metrics.LOOP_FAILED.labels("objective_resume")
    before = failed._value.get()
    await asyncio.wait_for(ObjectiveResume(fresh_store).run(0, first_retry_s=0.05), 10)
    assert calls == 3
    assert failed._value.get() == before + 2
    state = await objectives.get(fresh_store, "res-retry")
    assert state is not None and state.last_control_reason == "resume"


async def handler_context(
    store: Store, job_id: str | None = None, **watchdog: Any
) -> HandlerContext:
    """The handler context of a started watchdog job (its objective writes hold its fence),
    with the watchdog settings `watchdog` (WatchdogSettings fields) where given."""
    named = {"jobId": job_id} if job_id is not None else {}
    job = (await put(store, "factory-control", kind="factory.objective.watchdog", **named)).job
    settings = HandlerSettings(watchdog=WatchdogSettings(**watchdog))
    return await started_context(store, job.job_id, settings)


async def backdate(db_url: str, objective_id: str, minutes: int) -> None:
    """Make an objective look quiet for `minutes` (the projection's updated time)."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT state FROM objectives WHERE objective_id = %s", (objective_id,)
        )
        row = await cur.fetchone()
        assert row is not None
        state = ObjectiveState.model_validate(row[0])
        old = state.updated_at - timedelta(minutes=minutes)
        moved = state.model_copy(update={"updated_at": old})
        await conn.execute(
            "UPDATE objectives SET updated_at = %s, state = %s WHERE objective_id = %s",
            (old, psycopg.types.json.Jsonb(moved.to_json()), objective_id),
        )


async def test_the_watchdog_fires_for_quiet_objectives_within_its_scan_limit(
    fresh_store: Store, fresh_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for objective_id in ("wd-1", "wd-2", "wd-3"):
        await create_objective(fresh_store, objective_id, TASK)
    await backdate(fresh_db, "wd-1", 5)
    await backdate(fresh_db, "wd-2", 4)
    fired = ("receipt_factory_watchdog_fired_total", {"reason": "no_active_objective_work"})
    delivered = ("receipt_factory_control_deliveries_total", {"outcome": "created"})
    before = [metrics.value(name, **labels) for name, labels in (fired, delivered)]
    # wd-3 was just written: inside the grace period, it must not fire. With three windows of
    # one, a tick reads the window its id hashes to: this one's is the first (the oldest, wd-1).
    tick = next(f"tick-{n}" for n in itertools.count() if tick_of(f"tick-{n}") % 3 == 0)
    ticking = await handler_context(fresh_store, tick, scan_limit=1)
    assert ticking.job.job_id == tick
    first = await objective_watchdog(ticking)
    assert first["scanned"] == 1 and first["limit"] == 1
    assert first["reconciled"] == [{"objectiveId": "wd-1", "reason": "no_active_objective_work"}]
    second = await objective_watchdog(await handler_context(fresh_store, scan_limit=10))
    # wd-1 now has an active control job: no reason; wd-2 fires; wd-3 is still in its grace.
    assert second["reconciled"] == [{"objectiveId": "wd-2", "reason": "no_active_objective_work"}]
    assert second["reasons"]["no_active_objective_work"] == 1
    state = await objectives.get(fresh_store, "wd-2")
    assert state is not None and state.last_control_reason == "reconcile"
    control = await fresh_store.get_job(state.control_job_id or "")
    assert control is not None and control.payload["reason"] == "reconcile"
    after = [metrics.value(name, **labels) for name, labels in (fired, delivered)]
    assert [a - b for a, b in zip(after, before, strict=True)] == [2, 2]


async def test_the_watchdog_stops_at_its_timeout(
    fresh_store: Store, fresh_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await create_objective(fresh_store, "wd-slow", TASK)
    await backdate(fresh_db, "wd-slow", 5)
    async with await psycopg.AsyncConnection.connect(fresh_db) as conn, conn.transaction():
        # Another transaction holds the objective's stream: the watchdog's request waits on it.
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            ("stream:" + objective_stream("wd-slow"),),
        )
        started = asyncio.get_running_loop().time()
        # A 1 ms timeout is floored to 10 s.
        result = await objective_watchdog(await handler_context(fresh_store, timeout_ms=1))
        waited = asyncio.get_running_loop().time() - started
    assert result["timedOut"] is True
    assert result["reconciled"] == []
    assert 10 <= waited < 60
    state = await objectives.get(fresh_store, "wd-slow")
    assert state is not None and state.control_requested_seq == 0


async def test_the_objectives_projection_is_verified_and_rebuilt_from_the_chain(
    fresh_store: Store, fresh_db: str
) -> None:
    from receipts.assembly import rebuild, verify

    await create_objective(fresh_store, "proj-1", TASK)
    async with fresh_store.transaction() as tx:
        await objectives.request_control(tx, "proj-1", "test")
    expected = await objectives.get(fresh_store, "proj-1")
    assert await verify(fresh_store) == []
    await backdate(fresh_db, "proj-1", 5)  # the row no longer equals the fold of its stream
    assert await verify(fresh_store) == [
        "objective proj-1: projection differs from the fold of its chain"
    ]
    await rebuild(fresh_store)
    assert await verify(fresh_store) == []
    assert await objectives.get(fresh_store, "proj-1") == expected


async def backdate_job(db_url: str, job_id: str, minutes: int) -> None:
    """Make a running job's row as its last change other than a heartbeat left it `minutes`
    ago: leased then, its lease (as that row holds it) long expired. Its heartbeats since live
    in its lease row (`job_leases`), not in this one."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT state FROM jobs WHERE job_id = %s", (job_id,))
        row = await cur.fetchone()
        assert row is not None
        job = Job.model_validate(row[0])
        assert job.lease is not None and job.last_heartbeat_at is not None
        ago = timedelta(minutes=minutes)
        lease = job.lease.model_copy(
            update={"leased_at": job.lease.leased_at - ago, "expires_at": job.lease.leased_at}
        )
        moved = job.model_copy(
            update={
                "updated_at": job.updated_at - ago,
                "last_heartbeat_at": job.last_heartbeat_at - ago,
                "lease": lease,
            }
        )
        await conn.execute(
            "UPDATE jobs SET updated_at = %s, lease_expires_at = %s, state = %s WHERE job_id = %s",
            (moved.updated_at, lease.expires_at, psycopg.types.json.Jsonb(moved.to_json()), job_id),
        )


async def test_the_watchdog_sees_a_task_job_s_heartbeats(fresh_store: Store, fresh_db: str) -> None:
    """A task job whose command has been quiet for 11 minutes but which heartbeats (its worker
    alive, its lease renewed a moment ago) is neither stalled nor stale: its heartbeats live in
    its lease row (`job_leases`), and the watchdog's read of the objective's jobs takes them in,
    as every other read of a job does. Read from the jobs row alone, its last heartbeat was 11
    minutes ago and its lease long expired: the watchdog fired a reconcile at each tick."""
    await create_objective(fresh_store, "wd-beat", TASK)
    job, worker = await running_task_job(fresh_store, "wd-beat")
    dispatched = {"taskId": "t", "jobId": job.job_id, "try": 1}
    async with fresh_store.transaction() as tx:
        await objectives.update(
            tx, "wd-beat", lambda _: [Draft("objective.task.dispatched", dispatched)]
        )
    beat = functools.partial(
        ops.heartbeat, fresh_store, job.job_id, worker_id=worker, attempt=1, lease_ms=60_000
    )
    assert (await beat()).ok
    await backdate_job(fresh_db, job.job_id, 11)
    await backdate(fresh_db, "wd-beat", 11)
    assert (await beat()).ok  # alive, just now
    seen = (await objectives.jobs_by_ids(fresh_store, [job.job_id]))[job.job_id]
    assert seen == await fresh_store.get_job(job.job_id)
    result = await objective_watchdog(await handler_context(fresh_store, scan_limit=10))
    assert result["reconciled"] == []
