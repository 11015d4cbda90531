"""`within`: a wait with a time limit that never loses a cancellation (receipts/waits.py), and the
agent-job dispatcher's wait, where Python 3.11's `wait_for` once lost one in a CI run."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from receipts.listen import Notice
from receipts.waits import within
from roles.delivery.agent_jobs import AgentJobDispatcher


async def test_a_cancel_that_arrives_with_the_result_is_raised() -> None:
    queue: asyncio.Queue[str] = asyncio.Queue()

    async def loop_on() -> None:
        while True:  # as a loop around its wait does: only a cancel ends it
            await within(queue.get(), 60)

    waiter = asyncio.create_task(loop_on())
    await asyncio.sleep(0)  # the waiter is now waiting on the queue
    # An item and a cancel in the same loop step: asyncio.wait_for on 3.11 returns the item and
    # drops the cancel, and the loop runs on.
    queue.put_nowait("item")
    waiter.cancel()
    await asyncio.wait({waiter}, timeout=2)
    assert waiter.cancelled()


async def test_the_result_in_time_and_a_timeout_after_it() -> None:
    queue: asyncio.Queue[str] = asyncio.Queue()
    queue.put_nowait("ready")
    assert await within(queue.get(), 1) == "ready"
    with pytest.raises(TimeoutError):
        await within(queue.get(), 0.05)


async def test_the_agent_job_dispatcher_s_wait_ends_when_cancelled_with_a_notice() -> None:
    dispatcher = AgentJobDispatcher(cast(Any, None), None)
    notices: asyncio.Queue[Notice] = asyncio.Queue()
    loop = asyncio.get_running_loop()

    async def woken_again_and_again() -> None:
        while True:  # its run(): a pass, then the wait, until cancelled
            await dispatcher._woken(notices, loop.time() + 60)

    waiter = asyncio.create_task(woken_again_and_again())
    await asyncio.sleep(0)
    notices.put_nowait(Notice("jobs/x", 1, ("job.progress",)))
    waiter.cancel()
    await asyncio.wait({waiter}, timeout=2)
    assert waiter.cancelled()
