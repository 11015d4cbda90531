"""RECEIPT_DISPATCH_FROM_WORKERS: each worker dispatches the jobs of its own queue and runs their
drivers beside their attempts (tools/bench/README.md, "Dispatch from the workers"). Real role
processes: every job settles once, its driver ran on its own worker queue, and a worker
SIGKILLed holding both a driver and its attempt loses nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from receipts.deliveries import driver_workflow_id
from receipts.jobs import TERMINAL_STATUSES
from receipts.store import Store
from tests.e2e.conftest import task
from tests.e2e.roles_harness import RoleProcesses, wait_for
from tests.integration.helpers import put

pytestmark = pytest.mark.e2e
TERMINAL = tuple(TERMINAL_STATUSES)
SETTLE_TYPES = ("job.completed", "job.failed", "job.canceled")
NO_HANDLER = "nobody-handles-this"


async def _settled_once(store: Store, job_id: str) -> None:
    kinds = [r.type for r in await store.read_stream(f"jobs/{job_id}")]
    assert sum(k in SETTLE_TYPES for k in kinds) == 1, kinds


async def test_each_worker_dispatches_its_own_queue_and_hosts_the_drivers(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses], temporal_env: Any
) -> None:
    store, _ = e2e_store
    procs = roles(RECEIPT_DISPATCH_FROM_WORKERS="true")
    for name in ("driver", "worker-codex", "worker-chat"):
        procs.start(name)
    prefix = procs.env["RECEIPT_TASK_QUEUE_PREFIX"]
    try:
        codex = [(await put(store, payload_extra=task("true"))).job for _ in range(4)]
        noop = [(await put(store, agent=NO_HANDLER)).job for _ in range(3)]
        finals = {j.job_id: await wait_for(store, j.job_id, TERMINAL, 90) for j in codex + noop}
    except BaseException:
        print(procs.logs())
        raise
    assert [finals[j.job_id].status for j in codex] == ["completed"] * 4
    for job in noop:  # the spec's unknown-agent path, on worker-chat
        assert finals[job.job_id].status == "failed"
        assert finals[job.job_id].error == f"No handler for agent '{NO_HANDLER}'"
    for job, queue in [
        *((j, "receipt-codex") for j in codex),
        *((j, "receipt-chat") for j in noop),
    ]:
        await _settled_once(store, job.job_id)
        handle = temporal_env.client.get_workflow_handle(driver_workflow_id(job.job_id, 0))
        described = await handle.describe()
        assert described.task_queue == prefix + queue  # the driver ran beside its attempt
    # The driver role dispatched nothing: every first start was a worker's.
    driver_log = (procs.log_dir / "driver.0.log").read_text()
    assert "delivery.started" not in driver_log


async def test_a_worker_killed_holding_drivers_and_attempts_loses_nothing(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses]
) -> None:
    store, _ = e2e_store
    procs = roles(RECEIPT_DISPATCH_FROM_WORKERS="true", RECEIPT_ORG_MAX_RUNNING_PER_GROUP="0")
    procs.start("driver")
    procs.start("worker-codex")
    try:
        jobs = [(await put(store, payload_extra=task("sleep", "3"))).job for _ in range(3)]
        await wait_for(store, jobs[0].job_id, ("running",), 60)
        procs.kill("worker-codex")  # SIGKILL: the drivers' workflow tasks and the attempts
        more = [(await put(store, payload_extra=task("true"))).job for _ in range(2)]
        procs.start("worker-codex")
        finals = [await wait_for(store, j.job_id, TERMINAL, 120) for j in jobs + more]
    except BaseException:
        print(procs.logs())
        raise
    assert [f.status for f in finals] == ["completed"] * 5
    for job in jobs + more:
        await _settled_once(store, job.job_id)
