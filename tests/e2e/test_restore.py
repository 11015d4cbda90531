"""A database restored to an earlier point while Temporal keeps its newer state (docs/operations.md,
*Backups*): real role processes, a `pg_dump` taken mid-flight, the work going on past it, the
roles killed, the dump restored over the database and the roles started again on the same
Temporal. Every job the restored database holds settles once, no driver is left open, the
schedule Temporal holds is the one the receipts say, and the projections verify."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from receipts import assembly
from receipts import webhooks as hooks
from receipts.jobs import TERMINAL_STATUSES
from receipts.schedules import store as schedules
from receipts.schedules.model import ScheduleState
from receipts.store import Store
from receipts.tenancy import scoped_id
from tests.e2e.conftest import task
from tests.e2e.roles_harness import ROOT, RoleProcesses, wait_for
from tests.eventually import eventually
from tests.integration.helpers import put
from tests.integration.test_webhooks import Receiver

pytestmark = pytest.mark.e2e
TERMINAL = tuple(TERMINAL_STATUSES)
SETTLE_TYPES = ("job.completed", "job.failed", "job.canceled")
ROLES = ("driver", "worker-codex", "worker-control")


def _dump(url: str, path: Path) -> None:
    subprocess.run(["pg_dump", "-Fc", "-f", str(path), "-d", url], check=True)


def _restore(url: str, path: Path) -> None:
    """Drop the database and restore the dump into a new one of the same name."""
    name = conninfo_to_dict(url)["dbname"]
    with psycopg.connect(make_conninfo(url, dbname="postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)'.encode())
        admin.execute(f'CREATE DATABASE "{name}"'.encode())
    subprocess.run(["pg_restore", "--no-owner", "-d", url, str(path)], check=True)


def _cli(url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {"RECEIPT_DATABASE_URL": url, "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "roles.cli.main", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**env, "PYTHONPATH": f"{ROOT}:{ROOT / 'clients' / 'python'}"},
        check=False,
    )


async def _open_drivers(client: Any, queue: str) -> list[str]:
    query = f"TaskQueue = '{queue}' AND ExecutionStatus = 'Running'"
    return [w.id async for w in client.list_workflows(query)]


async def test_a_restore_to_an_earlier_point_settles_every_job_once(
    e2e_store: tuple[Store, str],
    roles: Callable[..., RoleProcesses],
    temporal_env: Any,
    tmp_path: Path,
) -> None:
    store, url = e2e_store
    client = temporal_env.client
    receiver = Receiver()
    server = await asyncio.start_server(receiver.handle, "127.0.0.1", 0)
    receiver.port = server.sockets[0].getsockname()[1]
    hook, _, _ = await hooks.create(
        store,
        "org-a",
        hooks.parse_create({"url": receiver.url("/a"), "events": ["job.completed"]}),
        max_per_organization=20,
    )
    procs = roles(
        RECEIPT_LOG_FORMAT="json",
        CODEX_JOB_LEASE_MS="20000",  # a restored lease nobody holds expires within 20 s
        RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS="2000",
        RECEIPT_RESONATE_QUEUED_REDRIVE_MIN_AGE_MS="3000",
        RECEIPT_RESONATE_QUEUED_REDRIVE_COOLDOWN_MS="3000",
        RECEIPT_SCHEDULE_CHECK_INTERVAL_MS="2000",
        RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_ENABLED="0",
        RECEIPT_WEBHOOK_ALLOWED_HOSTS="127.0.0.1",
        RECEIPT_WEBHOOK_POLL_INTERVAL_MS="200",
    )
    prefix = procs.env["RECEIPT_TASK_QUEUE_PREFIX"]
    tick = f"tick-{uuid.uuid4().hex[:6]}"
    sid = scoped_id("org-b", tick)
    temporal_schedule = client.get_schedule_handle(f"{prefix}receipt-schedule-{sid}")
    dump = tmp_path / "snapshot.dump"
    after_store: Store | None = None
    for role in ROLES:
        procs.start(role)
    try:
        # Before the snapshot: settled, running, waiting (delayed), and a schedule firing.
        settled = [(await put(store, payload_extra=task("true"))).job for _ in range(3)]
        for job in settled:
            await wait_for(store, job.job_id, ("completed",), 90)
        definition, _ = schedules.validate(
            {"interval": "2s", "agentId": "codex", "job": _org_b_job("true"), "overlap": "allow"},
            "org-b",
            schedules.Limits(min_interval_s=1),
            admin=False,
        )
        await schedules.create(store, "org-b", tick, definition, schedules.Limits(1))
        await eventually(
            lambda: schedules.get(store, sid),
            lambda s: s is not None and s.fired >= 2,
            timeout=60,
            every=0.5,
            what="the schedule firing",
        )
        running = [(await put(store, payload_extra=task("sleep", "6"))).job for _ in range(3)]
        delayed = [
            (await put(store, delayMs=6000, payload_extra=task("true"))).job for _ in range(2)
        ]
        for job in running:
            await wait_for(store, job.job_id, ("running",), 60)
        await asyncio.to_thread(_dump, url, dump)
        before = {j.job_id for j in settled + running + delayed}

        # Past the snapshot: everything settles, new jobs come and settle, the schedule is
        # paused, and one job named by its caller runs when the roles are killed.
        await schedules.change(store, sid, paused=True)
        await eventually(
            temporal_schedule.describe,
            lambda d: d.schedule.state.paused,
            timeout=30,
            every=0.5,
            what="the schedule paused in Temporal",
        )
        for job in running + delayed:
            await wait_for(store, job.job_id, ("completed",), 90)
        lost = [(await put(store, payload_extra=task("true"))).job for _ in range(3)]
        for job in lost:
            await wait_for(store, job.job_id, ("completed",), 90)
        named = f"again-{uuid.uuid4().hex[:6]}"
        again = (await put(store, jobId=named, payload_extra=task("sleep", "12"))).job
        await wait_for(store, again.job_id, ("running",), 60)
        owed = len(settled + running + delayed + lost)
        await eventually(
            lambda: asyncio.sleep(0, len({p.headers["webhook-id"] for p in receiver.at("/a")})),
            lambda n: n >= owed,
            timeout=60,
            every=0.2,
            what="every job.completed posted",
        )
        shown_before, _ = await hooks.deliveries_page(store, hook.webhook_id, None, 50)
        for role in ROLES:
            procs.kill(role)

        await asyncio.to_thread(_restore, url, dump)
        # The operator's step (docs/operations.md, *Backups*): the projections rebuilt mark
        # every schedule unsynced, so the sync writes each to Temporal again (without it
        # Temporal kept the schedule paused, its state past the snapshot, while the receipts
        # say active: it never fired again), and the id sequences move past the lost history's
        # (without it 6 webhook delivery ids shown before were shown again for others).
        rebuilt = await asyncio.to_thread(_cli, url, "restored")
        assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
        after_store = await assembly.open_store(url, min_size=1, max_size=5)
        restored = await after_store.get_job(again.job_id)
        assert restored is None  # the restored database never heard of it
        # Its caller, told nothing, posts it again under its id.
        again = (await put(after_store, jobId=named, payload_extra=task("sleep", "1"))).job
        restarted = time.monotonic()
        for role in ROLES:
            procs.start(role)
        finals = {}
        for job_id in [*before, again.job_id]:
            finals[job_id] = await wait_for(after_store, job_id, TERMINAL, 120)
        converged_s = time.monotonic() - restarted
        kinds = {
            job_id: [r.type for r in await after_store.read_stream(f"jobs/{job_id}")]
            for job_id in finals
        }
        open_drivers = await eventually(
            lambda: _open_drivers(client, f"{prefix}receipt-driver"),
            lambda ids: not ids,
            timeout=90,
            every=1,
            what="no driver left open",
        )
        drained_s = time.monotonic() - restarted
        print(
            f"restore: {len(finals)} jobs settled {converged_s:.1f} s after the restart, no "
            f"driver open after {drained_s:.1f} s"
        )
        # The schedule: the receipts say active, so Temporal must fire it again.
        state = await after_store_schedule(after_store, sid)
        assert state.status == "active"
        fired_at_restore = state.fired
        await eventually(
            lambda: after_store_schedule(after_store, sid),
            lambda s: s.fired >= fired_at_restore + 2,
            timeout=30,
            every=0.5,
            what="the restored (active) schedule firing again",
        )
        shown_after, _ = await hooks.deliveries_page(after_store, hook.webhook_id, None, 50)
    except BaseException:
        print(procs.logs())
        raise
    finally:
        server.close()
        await server.wait_closed()
        procs.stop_all()
        if after_store is not None:
            await after_store.close()
    assert {f.status for f in finals.values()} == {"completed"}, finals
    for job_id, types in kinds.items():
        assert sum(t in SETTLE_TYPES for t in types) == 1, (job_id, types)
    assert open_drivers == []
    verified = _cli(url, "rebuild-projections", "--verify-only")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    # An id a delivery of the lost history was shown under is never another delivery's.
    seen = {d["deliveryId"]: d["eventKey"] for d in shown_before}
    reissued = [d for d in shown_after if seen.get(d["deliveryId"], d["eventKey"]) != d["eventKey"]]
    print(
        f"restore: webhook delivery ids before and after: {len(shown_before)} / "
        f"{len(shown_after)}, reissued for another delivery {len(reissued)}"
    )
    assert reissued == []


def _org_b_job(*argv: str) -> dict[str, Any]:
    return {
        "payload": {
            "kind": "factory.task.run",
            "authContext": {"userId": "u", "organizationId": "org-b"},
            "task": {"command": list(argv)},
        }
    }


async def after_store_schedule(store: Store, sid: str) -> ScheduleState:
    state = await schedules.get(store, sid)
    assert state is not None
    return state
