"""A handler's tasks may not end their worker: SystemExit and KeyboardInterrupt they raise.

asyncio re-raises these two out of the event loop from whichever task raises them, awaited or
not: a task a handler started and never awaited that called `sys.exit` (argparse or click on
bad input) ended the worker's loop and every attempt it ran, without the drain. A handler's own
`sys.exit` is its failure already (`activities/handlers/sdk.py`), but not one of its tasks'.

The attempt starts its handler under `handler_scope`; every task started in that context (the
handler's, and theirs: a task copies its creator's context) runs through `_contained`, which
turns either exit into `HandlerExit`, an ordinary exception: the task ends with it, the exit is
logged (`attempt.handler_exit`) and counted (`receipt_handler_exits_total{agent}`), and the
attempt, while it runs, fails the job with it (retried as an exception is). A callback a handler
schedules itself (`loop.call_soon(sys.exit)`) is not a task and is not contained.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Coroutine, Iterator
from typing import Any

from receipts import metrics

log = logging.getLogger("activities.attempt")


class HandlerExit(Exception):
    """SystemExit or KeyboardInterrupt raised by a task of a handler, ended as a failure."""


class Exits:
    """The exits the tasks of one attempt's handler raised: `ended` is done at the first."""

    def __init__(self, job_id: str, agent_id: str) -> None:
        self.job_id = job_id
        self.agent_id = agent_id
        self.ended: asyncio.Future[HandlerExit] = asyncio.get_running_loop().create_future()

    def exited(self, exc: BaseException) -> HandlerExit:
        """Log and count `exc`, a handler task's exit; the failure it becomes."""
        failure = HandlerExit(f"{type(exc).__name__}: {exc} (a handler may not end its worker)")
        metrics.HANDLER_EXITS.labels(metrics.agent_label(self.agent_id)).inc()
        log.error(
            "a task of the handler raised %s; it ends that task, not the worker",
            type(exc).__name__,
            exc_info=exc,
            extra={"event": "attempt.handler_exit", "jobId": self.job_id, "error": str(failure)},
        )
        if not self.ended.done():
            self.ended.set_result(failure)
        return failure


_SCOPE: contextvars.ContextVar[Exits | None] = contextvars.ContextVar(
    "receipt_handler_exits", default=None
)


@contextlib.contextmanager
def handler_scope(exits: Exits) -> Iterator[None]:
    """Tasks started within (the handler's, and through its context all it starts) have their
    exits contained into `exits`. The loop's task factory is set at the first scope."""
    _contain(asyncio.get_running_loop())
    token = _SCOPE.set(exits)
    try:
        yield
    finally:
        _SCOPE.reset(token)


async def _contained(work: Coroutine[Any, Any, Any], exits: Exits) -> Any:
    try:
        return await work
    except (SystemExit, KeyboardInterrupt) as exc:
        raise exits.exited(exc) from exc


def _contain(loop: asyncio.AbstractEventLoop) -> None:
    """Set the loop's task factory (around the one it had, if any) to contain the exits of the
    tasks started in a handler's scope; other tasks are made as they were."""
    previous = loop.get_task_factory()
    if getattr(previous, "contains_handler_exits", False):
        return

    def factory(
        loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any
    ) -> asyncio.Future[Any]:
        context = kwargs.get("context")
        exits = context.get(_SCOPE) if context is not None else _SCOPE.get()
        if exits is None or not asyncio.iscoroutine(coro):
            return _made(previous, loop, coro, **kwargs)
        task = _made(previous, loop, _contained(coro, exits), **kwargs)
        # A task cancelled before its first step ends its wrapper without starting `coro`:
        # closed here, as the task would have closed it, not left to the collector's
        # "coroutine … was never awaited" (a no-op for one that ran).
        task.add_done_callback(lambda _: coro.close())
        return task

    factory.contains_handler_exits = True  # type: ignore[attr-defined]
    loop.set_task_factory(factory)  # type: ignore[arg-type]  # typeshed: no `context` keyword


def _made(
    previous: Any, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any
) -> asyncio.Future[Any]:
    """The task the loop's factory before ours (none: asyncio's own) makes of `coro`."""
    if previous is None:
        return asyncio.Task(coro, loop=loop, **kwargs)
    return previous(loop, coro, **kwargs)
