"""What one handler's misbehaviour leaves to the other jobs of its worker: nothing it does in
its own threads holds the worker's own work (the sandbox's) for the others."""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
import threading
from pathlib import Path
from typing import Any

from temporalio.testing import ActivityEnvironment

from activities.attempt import AttemptActivities
from activities.handlers.context import HandlerSettings
from activities.handlers.sdk import as_handler
from activities.sandbox import SandboxSettings
from receipt_worker import JobContext, handler
from receipts.messages import AttemptStatus
from receipts.store import Store
from tests.integration.test_attempt_activity import attempt_of, job_of


async def test_threads_a_handler_left_running_hold_no_other_job_s_sandboxed_command(
    store: Store,
) -> None:
    """The README has a handler run blocking work with `asyncio.to_thread`; a cancelled
    handler's thread runs on (a thread cannot be stopped), in the event loop's default executor
    (at most 32 threads, `cpu_count() + 4` on a small machine). The sandbox ran its own blocking
    steps (the cgroup, the read of bwrap's pid, the disk walk) there too: with those threads
    taken, every other job's command on the worker waited behind them, its attempt timed out,
    and an abort could not kill a running command (its kill reads the pid on a thread)."""
    gate = threading.Event()

    @handler("audit-thread-hog")
    async def hog(job: JobContext) -> None:
        # A blocking call with no timeout (a hung socket), many at once: cancelled by the
        # execution timeout, the ones already running never end.
        await asyncio.gather(*(asyncio.to_thread(gate.wait) for _ in range(64)))

    @handler("audit-neighbour", sandbox=True, group="codex")
    async def neighbour(job: JobContext) -> Any:
        return (await job.run_sandboxed(["sh", "-c", "echo hello"])).output_tail

    root = Path(tempfile.mkdtemp(prefix="audit-ws-", dir="/tmp"))
    await asyncio.to_thread(root.chmod, 0o755)  # traversable by the sandbox's uid
    settings = HandlerSettings(sandbox=SandboxSettings(RECEIPT_WORKSPACE_ROOT=root))
    activities = AttemptActivities(
        store,
        {"audit-thread-hog": as_handler(hog), "audit-neighbour": as_handler(neighbour)},
        settings=settings,
    )
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=1, activity_id="attempt:1")
    try:
        hogged = await job_of(store, "audit-thread-hog")
        attempt = attempt_of(hogged, "audit-thread-hog", execution_timeout_ms=500)
        result = await env.run(activities.execute_attempt, attempt)
        assert result.status == AttemptStatus.EXECUTION_TIMEOUT
        job_id = await job_of(store, "audit-neighbour")
        attempt = attempt_of(job_id, "audit-neighbour", execution_timeout_ms=5_000)
        result = await env.run(activities.execute_attempt, attempt)
        job = await store.get_job(job_id)
        assert job is not None
        assert (result.status, job.status) == (AttemptStatus.COMPLETED, "completed"), job.error
        assert job.result == "hello\n"
    finally:
        gate.set()
