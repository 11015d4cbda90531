"""A wait with a time limit that never loses a cancellation.

Python 3.11's `asyncio.wait_for` runs what it waits on in a task of its own; a cancel that
arrives in the same loop step as that task's result is dropped (CPython gh-86296, fixed in 3.12):
the caller gets the result, and a loop around the wait runs on after its task was cancelled.
A role's teardown then waited on that loop for ever (the agent-job dispatcher, met in a CI run:
its task stayed "cancelling" while its passes went on). `within` waits in the caller's own task
under `asyncio.timeout`, so a cancel is always delivered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], seconds: float | None) -> T:
    """`await awaitable`; `TimeoutError` after `seconds` (None: no limit), the awaitable
    cancelled. A cancel of the caller is raised even when the awaitable completes with it."""
    async with asyncio.timeout(seconds):
        return await awaitable
