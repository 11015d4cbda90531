"""What a job writes to the roles' logs: at INFO, one line per step that matters to an operator
(the driver and worker roles: `attempt.settled`; the api adds `api.enqueued`), the rest at DEBUG
(RECEIPT_LOG_LEVEL)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from receipts.store import Store
from tests.e2e.conftest import task
from tests.e2e.roles_harness import RoleProcesses, wait_for
from tests.eventually import eventually
from tests.integration.helpers import put

pytestmark = pytest.mark.e2e


async def test_a_job_that_runs_once_logs_one_info_line_in_the_driver_and_worker(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses]
) -> None:
    store, _ = e2e_store
    procs = roles(RECEIPT_LOG_FORMAT="json", RECEIPT_LOG_LEVEL="debug")
    procs.start("driver")
    procs.start("worker-codex")
    try:
        job = (await put(store, payload_extra=task("true"))).job
        done = await wait_for(store, job.job_id, ("completed",), 60)
    except BaseException:
        print(procs.logs())
        raise
    assert done.status == "completed"
    # The settle commits before the attempt writes its last DEBUG line (`attempt.handler_done`,
    # once its heartbeat task has ended): read the logs once that line is there (a loaded CI
    # machine stopped the roles in between once), not at the first sight of `completed`.
    await eventually(
        lambda: _written(procs, job.job_id),
        what="the worker's attempt.handler_done line",
        timeout=15,
    )
    procs.stop_all()
    lines = []
    for path in sorted(procs.log_dir.glob("*.log")):
        for raw in path.read_text().splitlines():
            if raw.startswith("{"):
                record = json.loads(raw)
                if record.get("jobId") == job.job_id:
                    lines.append((record["level"], record.get("event")))
    assert [event for level, event in lines if level == "info"] == ["attempt.settled"]
    debug = {event for level, event in lines if level == "debug"}
    assert {"delivery.started", "attempt.started", "attempt.handler_done"} <= debug


async def _written(procs: RoleProcesses, job_id: str) -> bool:
    return bool(procs.logged("worker-codex", {"attempt.handler_done"}, jobId=job_id))
