"""Schedules end to end: the api, worker-control (the schedule sync and the firings), the driver
and a codex worker on a Temporal dev server of the test's own (in memory, so a restart loses
every Temporal Schedule). A schedule every two seconds fires jobs named by their fire times, a
`skip` schedule skips while its job runs, a paused one fires nothing until resumed, and after a
Temporal restart the sync writes the schedules again and they go on firing."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from receipts.schedules import store as schedules
from receipts.schedules.model import ScheduleState
from receipts.store import Store
from receipts.tenancy import scoped_id
from roles.infra.ports import free_port, wait_port
from roles.infra.supervisor import Supervised
from roles.infra.temporal import temporal_argv
from tests.e2e.roles_harness import RoleProcesses
from tests.integration.api_support import AS_A, AS_B, TOKENS, enqueue_body, wait_healthz

pytestmark = pytest.mark.e2e
FIRE_ID = re.compile(r"^(?P<sid>.+):(?P<at>\d{8}T\d{6}Z)~")


def job(*argv: str) -> dict[str, Any]:
    return enqueue_body("org-a", payload_extra={"task": {"command": list(argv)}})


async def state_of(store: Store, sid: str) -> ScheduleState:
    state = await schedules.get(store, scoped_id("org-a", sid))
    assert state is not None
    return state


async def until(
    store: Store, sid: str, done: Callable[[ScheduleState], bool], timeout_s: float
) -> ScheduleState:
    deadline = time.monotonic() + timeout_s
    while True:
        state = await state_of(store, sid)
        if done(state):
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"schedule {sid} did not get there in {timeout_s} s: {state}")
        await asyncio.sleep(0.5)


def _temporal(port: int, log: Path) -> Supervised:
    server = Supervised("temporal", temporal_argv(None, port, None), log_file=log)
    server.start()
    return server


async def test_schedules_fire_skip_pause_and_survive_a_temporal_restart(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses], tmp_path: Path
) -> None:
    store, _ = e2e_store
    temporal_port, api_port = free_port(), free_port()
    server = _temporal(temporal_port, tmp_path / "temporal.log")
    procs = roles(
        address=f"127.0.0.1:{temporal_port}",
        RECEIPT_API_PORT=str(api_port),
        RECEIPT_API_TOKENS=TOKENS,
        RECEIPT_SCHEDULE_MIN_INTERVAL_S="1",
        RECEIPT_SCHEDULE_CHECK_INTERVAL_MS="2000",
        RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_ENABLED="0",
    )
    try:
        await wait_port(temporal_port)
        for role in ("api", "driver", "worker-control", "worker-codex"):
            procs.start(role)
        url = f"http://127.0.0.1:{api_port}"
        wait_healthz(url)
        every, skip = f"every-{uuid.uuid4().hex[:6]}", f"skip-{uuid.uuid4().hex[:6]}"
        async with httpx.AsyncClient(base_url=url, timeout=30) as api:
            made = await api.post(
                "/schedules",
                json={
                    "scheduleId": every,
                    "interval": "2s",
                    "agentId": "codex",
                    "job": job("true"),
                    "overlap": "allow",
                },
                headers=AS_A,
            )
            assert made.status_code == 201, made.text
            skipping = await api.post(
                "/schedules",
                json={
                    "scheduleId": skip,
                    "interval": "2s",
                    "agentId": "codex",
                    "job": job("sleep", "5"),
                },
                headers=AS_A,
            )
            assert skipping.status_code == 201, skipping.text

            # Fires every two seconds, each job named by its fire time, each fire time once.
            fired = await until(store, every, lambda s: s.fired >= 3, 60)
            runs = [f for f in fired.recent if f.outcome == "enqueued"]
            times = sorted(f.fire_time for f in runs)
            assert all(t.second % 2 == 0 and t.microsecond == 0 for t in times), times
            assert len(set(times)) == len(times)
            for firing in runs:
                assert firing.job_id is not None
                named = FIRE_ID.match(firing.job_id)
                assert named is not None and named["sid"] == every, firing.job_id
                at = datetime.strptime(named["at"], "%Y%m%dT%H%M%S%z")
                assert at == firing.fire_time
                assert await store.get_job(firing.job_id) is not None

            # `skip`: a five-second job every two seconds; firings while it runs are skipped,
            # so at most one of its jobs is active at a time.
            skipped = await until(store, skip, lambda s: s.skipped >= 1 and s.fired >= 1, 60)
            running = {f.running_job_id for f in skipped.recent if f.outcome == "skipped"}
            assert running <= {f.job_id for f in skipped.recent if f.outcome == "enqueued"}

            # Another organization cannot see or pause it.
            assert (await api.get(f"/schedules/{every}", headers=AS_B)).status_code == 404

            # Paused: nothing more fires (one firing may already be on its way).
            paused = await api.patch(f"/schedules/{every}", json={"paused": True}, headers=AS_A)
            assert paused.status_code == 200 and paused.json()["status"] == "paused"
            await asyncio.sleep(2.5)
            at_pause = (await state_of(store, every)).fired
            await asyncio.sleep(5)
            assert (await state_of(store, every)).fired == at_pause
            resumed = await api.patch(f"/schedules/{every}", json={"paused": False}, headers=AS_A)
            assert resumed.status_code == 200
            await until(store, every, lambda s: s.fired >= at_pause + 2, 30)

            # Temporal restarted without its state: the sync finds the schedules gone, writes
            # them again, and they fire again.
            server.kill()
            server = _temporal(temporal_port, tmp_path / "temporal.log")
            await wait_port(temporal_port)
            before = (await state_of(store, every)).fired
            after = await until(store, every, lambda s: s.fired >= before + 2, 90)
            assert after.fired >= before + 2
            restored = procs.logged("worker-control", {"schedule.restored"})
            assert restored, procs.logs()[-4000:]

            deleted = await api.delete(f"/schedules/{every}", headers=AS_A)
            assert deleted.status_code == 204
            await api.delete(f"/schedules/{skip}", headers=AS_A)
    except BaseException:
        print(procs.logs())
        raise
    finally:
        server.kill()
