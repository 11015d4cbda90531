"""A task a handler starts and does not await that raises SystemExit or KeyboardInterrupt (argparse
or click on bad input, `sys.exit` in a background coroutine): asyncio re-raises these two out of
the event loop, whoever awaits the task, so the worker's loop ended and with it every attempt it
ran, without the drain (the process exited with the task's exit code; its jobs waited for a
redelivery). The handler's tasks now end with the handler's failure: its attempt fails (retried
as an exception is) and the worker serves on."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import sys
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from activities.attempt import AttemptActivities
from activities.handlers.sdk import as_handler
from receipt_worker import JobContext, handler
from receipts import metrics
from receipts.messages import AttemptStatus
from receipts.store import Store
from tests.integration.test_attempt_activity import attempt_of, job_of


def _exits(exc: type[BaseException]) -> float:
    agent = metrics.agent_label("exit-" + exc.__name__)
    return metrics.value("receipt_handler_exits_total", agent=agent)


async def _quit(exc: type[BaseException], after_s: float = 0.0) -> None:
    await asyncio.sleep(after_s)
    if exc is SystemExit:
        sys.exit(3)  # as argparse does on bad input
    raise exc


@pytest.mark.parametrize("exc", [SystemExit, KeyboardInterrupt])
async def test_a_task_a_handler_did_not_await_that_exits_fails_its_job_not_the_worker(
    store: Store, exc: type[BaseException]
) -> None:
    agent = "exit-" + exc.__name__
    started: list[asyncio.Task[Any]] = []

    @handler(agent)
    async def quits(job: JobContext) -> str:
        started.append(asyncio.create_task(_quit(exc)))  # never awaited
        await asyncio.sleep(10)
        return "not reached"

    @handler("exit-neighbour")
    async def neighbour(job: JobContext) -> str:
        return "served"

    activities = AttemptActivities(
        store, {agent: as_handler(quits), "exit-neighbour": as_handler(neighbour)}
    )
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=1, activity_id="attempt:1")
    counted = _exits(exc)
    job_id = await job_of(store, agent)
    result = await env.run(activities.execute_attempt, attempt_of(job_id, agent))
    job = await store.get_job(job_id)
    assert job is not None
    # The handler's failure, retried while attempts remain (this job has two).
    assert (result.status, job.status) == ("failed", "queued"), (result, job.error)
    assert job.error is not None and exc.__name__ in job.error, job.error
    assert "may not end its worker" in job.error
    assert _exits(exc) == counted + 1
    # The loop the exit would have ended runs the next job.
    other = await job_of(store, "exit-neighbour")
    result = await env.run(activities.execute_attempt, attempt_of(other, "exit-neighbour"))
    assert result.status == AttemptStatus.COMPLETED


async def test_a_task_left_behind_that_exits_after_its_job_settled_ends_only_itself(
    store: Store,
) -> None:
    """A task that exits after its handler returned: the job keeps its outcome, the exit is
    counted and logged, and the worker's loop runs on."""
    agent = "exit-SystemExit"

    @handler(agent)
    async def leaves(job: JobContext) -> str:
        asyncio.create_task(_quit(SystemExit, after_s=0.2))  # noqa: RUF006 - never awaited
        return "done"

    activities = AttemptActivities(store, {agent: as_handler(leaves)})
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=1, activity_id="attempt:1")
    counted = _exits(SystemExit)
    job_id = await job_of(store, agent)
    result = await env.run(activities.execute_attempt, attempt_of(job_id, agent))
    assert result.status == AttemptStatus.COMPLETED
    await asyncio.sleep(0.5)  # the exit comes now, the job settled
    assert _exits(SystemExit) == counted + 1
    job = await store.get_job(job_id)
    assert job is not None and (job.status, job.result) == ("completed", "done")


async def test_a_task_a_handler_cancels_before_it_ran_leaves_no_coroutine_unawaited(
    store: Store,
) -> None:
    """A handler's task cancelled before its first step (`asyncio.wait_for(…, timeout=0)`, a
    watcher cancelled at once, a TaskGroup's sibling) ends as it would outside the scope: its
    coroutine is closed, not left for the collector to warn `coroutine … was never awaited` (a
    RuntimeWarning in every worker's log, an error under `-W error`)."""
    agent = "exit-cancelled-early"

    async def watch() -> None:
        await asyncio.sleep(10)

    @handler(agent)
    async def cancels(job: JobContext) -> str:
        watcher = asyncio.create_task(watch())
        watcher.cancel()  # nothing left to watch
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(watch(), timeout=0)  # a deadline already spent
        gc.collect()
        return "done"

    activities = AttemptActivities(store, {agent: as_handler(cancels)})
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=1, activity_id="attempt:1")
    job_id = await job_of(store, agent)
    unraisable: list[str] = []
    hook, sys.unraisablehook = sys.unraisablehook, lambda u: unraisable.append(str(u.exc_value))
    try:
        result = await env.run(activities.execute_attempt, attempt_of(job_id, agent))
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert result.status == AttemptStatus.COMPLETED
    assert unraisable == [], unraisable
