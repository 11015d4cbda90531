"""Scale-out on one machine: two processes of the driver and of every worker role against one
PostgreSQL and one Temporal server, as two pods of each Deployment would run.

Shows that both processes of each role take work (attempt leases name the worker's pid; driver
workflow tasks name the driver's Temporal identity), that every job settles exactly once, that
/readyz reports each process ready only once Temporal sees it poll, and that SIGKILL of one
process of each role mid-load loses nothing: the survivors finish every job.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType

from receipts.jobs import TERMINAL_STATUSES, Job
from receipts.store import Store
from roles.role import WORKER_QUEUES
from tests.e2e.conftest import task
from tests.e2e.roles_harness import RoleProcesses, wait_for
from tests.eventually import eventually
from tests.integration.helpers import put

pytestmark = pytest.mark.e2e

ROLES = ("driver", *WORKER_QUEUES)
# Lease 10 s: a delivery whose worker died is redelivered ~3 s later. Two attempts at once per
# worker, so one process cannot swallow a batch; the watchdog Schedule stays off (no extra jobs).
ENV = {
    "RECEIPT_WORKER_LOST_TIMEOUT_MS": "3000",
    "CODEX_JOB_LEASE_MS": "10000",
    "JOB_LEASE_MS": "10000",
    "FACTORY_CONTROL_JOB_LEASE_MS": "10000",
    "RECEIPT_RESONATE_EXECUTE_CONCURRENCY": "2",
    "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_ENABLED": "0",
}
PER_ROLE = 8  # jobs per worker role and batch: 48 jobs in all on a 2-core machine
SETTLEMENTS = ("job.completed", "job.failed", "job.canceled")


def health_port(procs: RoleProcesses, name: str) -> int | None:
    """The port the process logged for /metrics, /healthz and /readyz (RECEIPT_METRICS_PORT=0)."""
    log = procs.log_dir / f"{name}.{procs.restarts[name]}.log"
    for line in log.read_text(errors="replace").splitlines():
        if '"metrics.listening"' in line:
            return int(json.loads(line)["port"])
    return None


def get(port: int, path: str) -> tuple[int, dict[str, Any] | str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            body = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as error:
        body, status = error.read().decode(), error.code
    return status, json.loads(body) if body.startswith("{") else body


async def wait_ready(procs: RoleProcesses, names: list[str], timeout: float = 120) -> None:
    """Until every process answers /readyz 200 (it polls its task queues and reaches the database)."""
    pending = set(names)

    async def not_ready() -> set[str]:
        for name in sorted(pending):
            port = health_port(procs, name)
            if port is not None and (await asyncio.to_thread(get, port, "/readyz"))[0] == 200:
                pending.discard(name)
        return pending

    await eventually(not_ready, lambda left: not left, timeout=timeout, every=0.5, what="ready")


async def enqueue_batch(store: Store, codex_seconds: str) -> dict[str, list[Job]]:
    """PER_ROLE jobs for each worker role: codex commands, control scans, chat (no handler)."""
    jobs: dict[str, list[Job]] = {role: [] for role in WORKER_QUEUES}
    for _ in range(PER_ROLE):
        jobs["worker-codex"].append(
            (await put(store, payload_extra=task("sleep", codex_seconds))).job
        )
        jobs["worker-control"].append(
            (await put(store, "factory-control", kind="factory.objective.watchdog")).job
        )
        jobs["worker-chat"].append((await put(store, "scale-chat")).job)
    return jobs


async def settle_all(store: Store, jobs: dict[str, list[Job]], timeout: float) -> None:
    for batch in jobs.values():
        for job in batch:
            await wait_for(store, job.job_id, tuple(TERMINAL_STATUSES), timeout)


async def driver_identities(client: Any, job: Job) -> set[str]:
    """Temporal identities (pid@host) of the workers that completed the driver's workflow tasks."""
    identities = set()
    handle = client.get_workflow_handle(job.job_id)
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            identities.add(event.workflow_task_completed_event_attributes.identity)
    return identities


async def assert_settled_once(store: Store, jobs: dict[str, list[Job]]) -> None:
    """Every job is terminal with exactly one settlement, the last receipt of its stream."""
    for role, batch in jobs.items():
        for job in batch:
            kinds = [r.type for r in await store.read_stream(f"jobs/{job.job_id}")]
            final = await store.get_job(job.job_id)
            assert final is not None and final.terminal, job.job_id
            if role == "worker-chat":  # no handler for the agent: failed, not retried
                assert final.status == "failed" and "No handler" in (final.error or "")
                assert kinds[-1] == "job.failed" and "job.completed" not in kinds, kinds
            else:
                assert final.status == "completed", (job.job_id, final.status, final.error)
                assert kinds[-1] == "job.completed" and kinds.count("job.completed") == 1, kinds
            assert "job.canceled" not in kinds, kinds


async def worker_pids(store: Store, job: Job) -> dict[str, int]:
    """workerId (one delivery) -> the pid of the process that ran it."""
    found = {}
    for receipt in await store.read_stream(f"jobs/{job.job_id}"):
        process = receipt.data.get("process")
        if receipt.type in ("job.leased", "job.heartbeat") and process:
            found[receipt.data["workerId"]] = int(process["pid"])
    return found


async def running_pids(store: Store, batch: list[Job]) -> set[int]:
    pids = set()
    for job in batch:
        current = await store.get_job(job.job_id)
        if current is not None and current.status == "running" and current.lease:
            if current.lease.process:
                pids.add(int(current.lease.process["pid"]))
    return pids


async def test_two_processes_of_every_role_share_the_work_and_survive_a_sigkill_each(
    e2e_store: tuple[Store, str],
    roles: Callable[..., RoleProcesses],
    temporal_env: Any,
) -> None:
    store, _ = e2e_store
    procs = roles(**ENV)
    names = [f"{role}-{i}" for role in ROLES for i in (1, 2)]
    for name in names:
        procs.start(name, name[:-2])
    client = temporal_env.client
    try:
        await wait_ready(procs, names)
        pid_of = {name: procs.pid_of(name) for name in names}

        # 1. Both processes of each role take work.
        first = await enqueue_batch(store, "1")
        await settle_all(store, first, 120)
        taken: dict[str, Counter[str]] = {}
        for role, batch in first.items():
            counts: Counter[str] = Counter()
            for job in batch:
                for pid in (await worker_pids(store, job)).values():
                    counts[procs.name_of(pid) or f"pid {pid}"] += 1
            taken[role] = counts
            assert set(counts) == {f"{role}-1", f"{role}-2"}, (role, counts)
        drivers: Counter[str] = Counter()
        for batch in first.values():
            for job in batch:
                for identity in await driver_identities(client, job):
                    pid = int(identity.split("@")[0])
                    drivers[procs.name_of(pid) or identity] += 1
        assert set(drivers) == {"driver-1", "driver-2"}, drivers
        print(f"attempts taken per process: {taken}; driver workflow tasks: {drivers}")

        # 2. SIGKILL one process of each role while both workers of each queue hold work.
        second = await enqueue_batch(store, "4")
        killed_pids = {pid_of[f"{role}-1"] for role in ROLES}
        deadline = asyncio.get_running_loop().time() + 60
        while pid_of["worker-codex-1"] not in await running_pids(store, second["worker-codex"]):
            assert asyncio.get_running_loop().time() < deadline, "worker-codex-1 took no job"
            await asyncio.sleep(0.1)
        for role in ROLES:
            procs.kill(f"{role}-1")
        await settle_all(store, second, 180)
        for name in (f"{role}-2" for role in ROLES):
            assert procs.processes[name].poll() is None, f"{name} died"
            port = health_port(procs, name)
            assert port is not None
            status, body = await asyncio.to_thread(get, port, "/readyz")
            assert status == 200, (name, body)
            metrics = (await asyncio.to_thread(get, port, "/metrics"))[1]
            assert "receipt_role_ready 1.0" in str(metrics), name
    except BaseException:
        print(procs.logs())
        raise
    await assert_settled_once(store, first)
    await assert_settled_once(store, second)
    # The codex jobs the killed worker held were finished by a delivery in a survivor.
    moved = 0
    for job in second["worker-codex"]:
        pids = await worker_pids(store, job)
        if not set(pids.values()) & killed_pids:
            continue
        moved += 1
        receipts = await store.read_stream(f"jobs/{job.job_id}")
        completed = next(r for r in receipts if r.type == "job.completed")
        assert pids[completed.data["workerId"]] not in killed_pids, job.job_id
    assert moved >= 1
    print(f"codex jobs held by the killed worker and finished by the survivor: {moved}")
