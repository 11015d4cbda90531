"""Threads for the worker's own blocking steps (the sandbox's cgroups, its read of bwrap's pid,
its disk walks, its /etc views; the workspaces' adoption and sweep), apart from the event
loop's default executor.

That executor is the handlers': the README has a handler run blocking work with
`asyncio.to_thread`. It has at most 32 threads (`cpu_count() + 4` on a small machine), and a
cancelled handler's thread runs on (a thread cannot be stopped: a blocking call without a
timeout never ends). With those threads taken, the sandbox's own steps waited behind them:
every other job's command on the worker hung until its attempt timed out, and an abort could
not kill a running command (its kill reads the command's pid on a thread)."""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

# Each sandboxed command takes one or two at a time (its disk walk, a cgroup step or the pid
# read), a worker-codex runs 4 commands at once by default: room for several times that.
THREADS = 32

_P = ParamSpec("_P")
_T = TypeVar("_T")

_executor = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="receipt-blocking")


async def off_loop(function: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """`asyncio.to_thread` on the worker's own threads: `function(*args, **kwargs)` in a thread,
    with the caller's context (its span)."""
    call = functools.partial(contextvars.copy_context().run, function, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_executor, call)
