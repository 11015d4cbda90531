"""Worker faults with real role processes: SIGKILL, SIGSTOP (a zombie) and a poison handler."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from receipts.jobs import TERMINAL_STATUSES
from receipts.store import Store
from tests.e2e.conftest import task
from tests.e2e.roles_harness import RoleProcesses, holder_id, wait_for
from tests.eventually import eventually
from tests.integration.helpers import put

pytestmark = pytest.mark.e2e

SETTLE_TYPES = ("job.completed", "job.failed", "job.canceled")
# Lease 10 s: heartbeat every 3.3 s; Temporal redelivers after 3 s without hearing from the
# worker (its default, 30 s, is pinned by test_attempt_faults.py).
TIMING = {
    "CODEX_JOB_LEASE_MS": "10000",
    "JOB_LEASE_MS": "10000",
    "RECEIPT_WORKER_LOST_TIMEOUT_MS": "3000",
}


async def receipts_of(store: Store, job_id: str) -> list[Any]:
    return await store.read_stream(f"jobs/{job_id}")


async def holder(store: Store, job_id: str) -> int:
    job = await wait_for(store, job_id, ("running",), 60)
    assert job.lease is not None and job.lease.process is not None
    return int(job.lease.process["pid"])


async def test_a_zombie_worker_is_superseded_and_every_later_write_of_it_is_rejected(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses]
) -> None:
    store, _ = e2e_store
    procs = roles(**TIMING)
    procs.start("driver")
    procs.start("worker-codex-1", "worker-codex")
    procs.start("worker-codex-2", "worker-codex")
    try:
        job = (await put(store, payload_extra=task("sleep", "5"))).job
        zombie = procs.name_of(await holder(store, job.job_id))
        assert zombie is not None
        zombie_id = await holder_id(store, job.job_id)  # delivery 1 of attempt 1
        procs.signal(zombie, signal.SIGSTOP)
        # Cut off from Temporal (no activity heartbeats) but not from PostgreSQL. Temporal
        # redelivers the attempt (a start-fence heartbeat takes the lease over) or, when the
        # frozen process's own pending polls swallow the redeliveries, the driver fails the
        # stale lease and the next attempt runs. Either way the zombie loses its fence.
        superseded = await _wait_until_superseded(store, job.job_id, zombie_id, 90)
        procs.signal(zombie, signal.SIGCONT)
        done = await wait_for(store, job.job_id, tuple(TERMINAL_STATUSES), 90)
        # The zombie wakes up and tries its late writes; its fence refuses them. Its log says
        # when it tried (at most 4 s: a delivery Temporal cancelled may log neither).
        with contextlib.suppress(AssertionError):
            await eventually(
                lambda: asyncio.to_thread(
                    procs.logged,
                    zombie,
                    {"attempt.lease_lost", "attempt.settled"},
                    workerId=zombie_id,
                ),
                timeout=4,
                every=0.2,
            )
    except BaseException:
        print(procs.logs())
        raise
    assert done.status == "completed"
    receipts = await receipts_of(store, job.job_id)
    assert sum(r.type in SETTLE_TYPES for r in receipts if r.type != "job.failed") == 1
    assert [r.type for r in receipts].count("job.completed") == 1
    late = [r for r in receipts if r.seq > superseded and r.data.get("workerId") == zombie_id]
    assert late == []
    assert receipts[-1].type == "job.completed"
    assert receipts[-1].data["workerId"] != zombie_id


async def _wait_until_superseded(store: Store, job_id: str, worker_id: str, timeout: float) -> int:
    """Return the seq of the receipt that took the lease away from `worker_id`."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        for receipt in await receipts_of(store, job_id):
            took_over = receipt.type == "job.heartbeat" and receipt.data.get("startFence")
            failed = receipt.type in ("job.failed", "job.lease_expired")
            if took_over or failed:
                return receipt.seq
        await asyncio.sleep(0.1)
    raise AssertionError(f"{worker_id} was never superseded")


async def test_a_worker_killed_mid_run_is_redelivered_and_settles_once(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses]
) -> None:
    store, _ = e2e_store
    procs = roles(**TIMING)
    procs.start("driver")
    procs.start("worker-codex")
    try:
        jobs = [(await put(store, payload_extra=task("sleep", "3"))).job for _ in range(5)]
        await holder(store, jobs[0].job_id)
        procs.kill("worker-codex")
        procs.start("worker-codex")
        finals = [await wait_for(store, j.job_id, tuple(TERMINAL_STATUSES), 90) for j in jobs]
    except BaseException:
        print(procs.logs())
        raise
    assert [f.status for f in finals] == ["completed"] * 5
    for job in jobs:
        receipts = await receipts_of(store, job.job_id)
        assert sum(r.type in SETTLE_TYPES for r in receipts) == 1


def _live_pids_running(argv: list[str]) -> list[int]:
    """PIDs of live (not zombie) processes whose command line is exactly `argv`."""
    wanted = "\0".join(argv) + "\0"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if cmdline == wanted and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux setpriv (Linux)")
async def test_a_command_dies_with_its_sigkilled_worker(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses]
) -> None:
    store, _ = e2e_store
    argv = ["sleep", "97.531"]  # unique enough to find among this machine's processes
    procs = roles(**TIMING)
    procs.start("driver")
    procs.start("worker-codex")
    try:
        job = (await put(store, maxAttempts=1, payload_extra=task(*argv))).job
        await holder(store, job.job_id)
        for _ in range(50):
            if _live_pids_running(argv):
                break
            await asyncio.sleep(0.1)
        assert len(_live_pids_running(argv)) == 1
        procs.kill("worker-codex")
        for _ in range(50):
            if not _live_pids_running(argv):
                break
            await asyncio.sleep(0.1)
    except BaseException:
        print(procs.logs())
        raise
    assert _live_pids_running(argv) == []


async def test_a_handler_that_kills_its_worker_fails_after_its_budget_without_looping(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses]
) -> None:
    store, _ = e2e_store
    # Only an unconfined command can reach its worker (sandboxed, $PPID is the sandbox's init).
    procs = roles(CODEX_JOB_LEASE_MS="6000", JOB_LEASE_MS="6000", RECEIPT_CODEX_SANDBOX="none")
    procs.start("driver")
    procs.start("worker-codex")
    try:
        poison = (
            await put(store, maxAttempts=2, payload_extra=task("sh", "-c", "kill -9 $PPID"))
        ).job
        # It shares the worker the poison kills, so it may die with it: give it the most
        # attempts (8) so collateral deaths cannot exhaust it.
        healthy = (await put(store, maxAttempts=8, payload_extra=task("true"))).job
        deadline = asyncio.get_running_loop().time() + 120
        while asyncio.get_running_loop().time() < deadline:
            procs.restart_dead()
            job = await store.get_job(poison.job_id)
            if job is not None and job.terminal:
                break
            await asyncio.sleep(0.2)
        done = await wait_for(store, poison.job_id, tuple(TERMINAL_STATUSES), 1)
        other = await wait_for(store, healthy.job_id, tuple(TERMINAL_STATUSES), 90)
    except BaseException:
        print(procs.logs())
        raise
    assert done.status == "failed" and done.attempt == 2
    assert done.error == "lease expired after 2 attempts"
    assert other.status == "completed"
    receipts = await receipts_of(store, poison.job_id)
    kinds = [r.type for r in receipts]
    assert kinds.count("job.leased") == 2
    # Each attempt: its deliveries died, the lease expired (requeue, then the terminal failure).
    assert kinds.count("job.lease_expired") == 2
    assert not any(t in SETTLE_TYPES for t in kinds)
    assert procs.restarts["worker-codex"] <= 5  # two deliveries per attempt, two attempts


async def test_sigterm_releases_an_unfinished_job_without_costing_an_attempt(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses]
) -> None:
    store, _ = e2e_store
    procs = roles(**TIMING, RECEIPT_SHUTDOWN_GRACE_MS="1000")
    procs.start("driver")
    procs.start("worker-codex")
    try:
        job = (await put(store, maxAttempts=1, payload_extra=task("sleep", "8"))).job
        await holder(store, job.job_id)
        procs.signal("worker-codex", signal.SIGTERM)
        assert procs.processes["worker-codex"].wait(30) == 0
        released = await wait_for(store, job.job_id, ("queued",), 10)
        procs.start("worker-codex")
        done = await wait_for(store, job.job_id, tuple(TERMINAL_STATUSES), 60)
    except BaseException:
        print(procs.logs())
        raise
    assert released.error == "worker shutdown" and released.attempt == 0
    receipts = await receipts_of(store, job.job_id)
    release = next(r for r in receipts if r.type == "job.failed")
    assert release.data["refundAttempt"] is True and release.data["retryable"] is True
    # maxAttempts 1: only because the release cost nothing can the job still complete.
    assert (done.status, done.attempt) == ("completed", 1)
