"""The raw Temporal pipelines the bench compares Receipt with: no receipts, no database.

TOOLING, NOT PRODUCT: these Temporal workflows exist only for `python -m tools.bench`; they are
not in `workflows/`, not in the wheel and no role registers them.

Three shapes, each started as one workflow per job on a driver task queue:

* **activity** (`BenchRawActivityPipelineWorkflow`): the workflow runs one no-op activity on the
  worker task queue — the shape a Temporal user writes by hand, and the shape the targets
  compare with.
* **sandboxed** (`BenchRawSandboxedPipelineWorkflow`): the same, but the activity runs `true`
  in Receipt's command sandbox (`activities.sandbox.run_sandboxed`, worker-codex's settings, one
  shared workspace as the bench's jobs share their objective's): the work a codex `true` job
  does besides its receipts, so Receipt's ratio to it is what the receipts, fences and the
  driver's bookkeeping cost.
* **child** (`BenchRawPipelineWorkflow`): the workflow starts a child workflow on the worker
  task queue (`ParentClosePolicy.ABANDON`) that runs the no-op activity — the shape of a
  Receipt delivery with a `JobAttemptWorkflow` per attempt.

The activity returns its wall-clock start and end, which stand in for `job.leased` and the
terminal receipt. The workers use Receipt's workflow runner (`roles.delivery.runtime`,
unsandboxed) and the event loops of the roles they stand for, so the comparison measures what
Receipt adds, not a difference in configuration.

`python -m tools.bench.raw ADDRESS driver|worker QUEUE_PREFIX [CONCURRENCY]` runs one side in a
process of its own (as the driver and worker-codex roles are), until SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.workflow import ParentClosePolicy

from roles.infra.settings import RuntimeSettings

PIPELINE_WORKFLOW = "BenchRawPipelineWorkflow"
ACTIVITY_PIPELINE_WORKFLOW = "BenchRawActivityPipelineWorkflow"
SANDBOXED_PIPELINE_WORKFLOW = "BenchRawSandboxedPipelineWorkflow"
ATTEMPT_WORKFLOW = "BenchRawAttemptWorkflow"
NOOP_ACTIVITY = "bench_noop"
SANDBOXED_ACTIVITY = "bench_sandboxed_true"
SANDBOXED = "sandboxed"
DRIVER_QUEUE = "bench-raw-driver"
WORKER_QUEUE = "bench-raw-worker"
# The workflow each baseline side starts per job.
PIPELINES = {
    "base": ACTIVITY_PIPELINE_WORKFLOW,
    "child": PIPELINE_WORKFLOW,
    SANDBOXED: SANDBOXED_PIPELINE_WORKFLOW,
}
_TIMEOUT = timedelta(seconds=60)
# This process's settings, read once at start (`__main__`).
_SETTINGS = RuntimeSettings()
_RETRY = RetryPolicy(maximum_attempts=2)


@activity.defn(name=NOOP_ACTIVITY)
async def noop(job: dict[str, Any]) -> list[float]:
    """Do nothing; return `[started, settled]` (epoch seconds)."""
    started = time.time()
    return [started, time.time()]


@activity.defn(name=SANDBOXED_ACTIVITY)
async def sandboxed_true(job: dict[str, Any]) -> list[float]:
    """Run `true` in the command sandbox as a codex job's handler does (with the settings its
    process read at start, its output collected); return `[started, settled]` (epoch seconds)."""
    from activities.sandbox import run_sandboxed
    from activities.workspaces import objective_workspace

    started = time.time()
    settings = _SETTINGS.sandbox
    output: list[str] = []

    async def collect(text: str) -> None:
        output.append(text)

    ended = await run_sandboxed(
        ["true"],
        workspace=objective_workspace("bench", "bench-raw", settings),
        on_output=collect,
        settings=settings,
    )
    if ended.exit_code != 0:
        raise RuntimeError(f"sandboxed true exited {ended.exit_code}: {''.join(output)[-300:]}")
    return [started, time.time()]


async def _run_noop(
    job: dict[str, Any], task_queue: str | None = None, name: str = NOOP_ACTIVITY
) -> list[float]:
    """The no-op (or `name`) activity on `task_queue` (default: the calling workflow's own)."""
    result: list[float] = await workflow.execute_activity(
        name,
        job,
        task_queue=task_queue,
        start_to_close_timeout=_TIMEOUT,
        retry_policy=_RETRY,
    )
    return result


@workflow.defn(name=ACTIVITY_PIPELINE_WORKFLOW)
class RawActivityPipelineWorkflow:
    """One workflow per job: the no-op activity on the worker task queue."""

    @workflow.run
    async def run(self, job: dict[str, Any]) -> list[float]:
        return await _run_noop(job, job["workerQueue"])


@workflow.defn(name=SANDBOXED_PIPELINE_WORKFLOW)
class RawSandboxedPipelineWorkflow:
    """One workflow per job: the sandboxed `true` activity on the worker task queue."""

    @workflow.run
    async def run(self, job: dict[str, Any]) -> list[float]:
        return await _run_noop(job, job["workerQueue"], SANDBOXED_ACTIVITY)


@workflow.defn(name=ATTEMPT_WORKFLOW)
class RawAttemptWorkflow:
    """The child: one activity on the worker task queue, its own."""

    @workflow.run
    async def run(self, job: dict[str, Any]) -> list[float]:
        return await _run_noop(job)


@workflow.defn(name=PIPELINE_WORKFLOW)
class RawPipelineWorkflow:
    """The parent: start the child on the worker task queue and return its result."""

    @workflow.run
    async def run(self, job: dict[str, Any]) -> list[float]:
        result: list[float] = await workflow.execute_child_workflow(
            ATTEMPT_WORKFLOW,
            job,
            id=f"{workflow.info().workflow_id}:attempt:1",
            task_queue=job["workerQueue"],
            parent_close_policy=ParentClosePolicy.ABANDON,
        )
        return result


async def serve(address: str, side: str, prefix: str, concurrency: int) -> None:
    """Run the `driver` or `worker` side of the raw pipelines until SIGTERM or SIGINT."""
    from temporalio.client import Client
    from temporalio.worker import Worker

    from roles.delivery.runtime import WORKFLOW_RUNNER

    client = await Client.connect(address)
    if side == "driver":
        worker = Worker(
            client,
            task_queue=prefix + DRIVER_QUEUE,
            workflows=[
                RawPipelineWorkflow,
                RawActivityPipelineWorkflow,
                RawSandboxedPipelineWorkflow,
            ],
            workflow_runner=WORKFLOW_RUNNER,
        )
    else:
        from activities import sandbox

        await sandbox.announce(
            _SETTINGS.sandbox
        )  # as the worker roles do: probe once, log how commands run
        worker = Worker(
            client,
            task_queue=prefix + WORKER_QUEUE,
            workflows=[RawAttemptWorkflow],
            activities=[noop, sandboxed_true],
            max_concurrent_activities=concurrency,
            workflow_runner=WORKFLOW_RUNNER,
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    running = asyncio.create_task(worker.run())
    await stop.wait()
    await worker.shutdown()
    await running
    if side != "driver":
        from activities import sandbox_etc

        sandbox_etc.remove_views()


if __name__ == "__main__":
    from roles.infra.process import run_event_loop
    from roles.infra.settings import load_or_exit
    from roles.role import event_loop_for

    _SETTINGS = load_or_exit()
    # The event loop of the role each side stands for, so both pipelines run alike.
    role = "driver" if sys.argv[2] == "driver" else "worker-codex"
    run_event_loop(
        serve(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 4),
        event_loop_for(role, _SETTINGS.process),
    )
