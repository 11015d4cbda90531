"""The one way a test waits for a condition: `eventually` polls an async read until its value
satisfies a predicate, and fails naming what it waited for and the last value it saw."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    read: Callable[[], Awaitable[T]],
    until: Callable[[T], object] = bool,
    *,
    timeout: float = 30.0,
    every: float = 0.05,
    what: str = "the condition",
) -> T:
    """`read()` again every `every` seconds until `until(value)` holds; return that value.

    Raises AssertionError after `timeout` seconds naming `what` and the last value read.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await read()
        if until(value):
            return value
        if loop.time() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s; last seen: {value!r}")
        await asyncio.sleep(every)
