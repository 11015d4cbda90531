"""What a handler author writes against: `@handler`, the `JobContext` a handler is given, the
`Command`s it reads, and `Retry` / `Fail` to end an attempt otherwise than with a result.

This module holds the contract only; the worker's side of it (leases, fences, the sandbox) is
`activities/handlers/sdk.py`.
"""

from __future__ import annotations

import abc
import inspect
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from receipts.kinds import GROUP_QUEUES, KINDS
from receipts.text import sanitize

# An agent id a handler may take: it names an entry point and is a path segment of the API.
AGENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
DEFAULT_KINDS: tuple[str, ...] = ("factory.task.run",)


@dataclass(frozen=True, slots=True)
class Command:
    """A steer or follow_up sent to the job (`POST /jobs/{jobId}/commands`), already marked
    consumed when the handler is handed it: each reaches one attempt once. An attempt that does
    not complete (`Retry`, a failure that is retried, a lost lease) gives back what it consumed:
    the next attempt reads those commands again."""

    command_id: str
    type: str
    payload: Any


@dataclass(frozen=True, slots=True)
class SandboxRun:
    """How a command run by `JobContext.run_sandboxed` ended: its exit status (negative: killed
    by that signal), the last lines of its output, and whether a process of it was killed at the
    sandbox's memory limit."""

    exit_code: int | None
    output_tail: str
    lines: int
    memory_limit: bool = False


class Retry(Exception):
    """Raise to end this attempt and have the job attempted again (while attempts remain), not
    before `delay_ms` (clamped to 30 s; None: at once)."""

    def __init__(
        self, message: str = "retry requested", *, delay_ms: int | float | None = None
    ) -> None:
        if delay_ms is not None and (
            isinstance(delay_ms, bool) or not 0 <= delay_ms < float("inf")
        ):
            raise ValueError("delay_ms must be a finite number of milliseconds, at least 0")
        super().__init__(message)
        # Whole milliseconds: a float delay (5000.0) is that delay, not none at all.
        self.delay_ms = None if delay_ms is None else int(delay_ms)


class Fail(Exception):
    """Raise to fail the job with `message` (and `result`, an object: its fields are the job's
    result beside `status`); with `retryable=True` it is attempted again while attempts remain,
    as `Retry` without a delay."""

    def __init__(
        self, message: str, *, retryable: bool = False, result: dict[str, Any] | None = None
    ) -> None:
        if result is not None and not isinstance(result, dict):
            # The job's result on a failure is an object with its `status`: a list or a string
            # would be dropped for `{status}` alone, so it is refused where it is made.
            raise TypeError("Fail(result=...) must be a dict (the failed job's result fields)")
        if result is not None:
            try:
                json.dumps(sanitize(result))  # as the store writes it: bytes decoded, ...
            except (TypeError, ValueError, RecursionError) as exc:  # one that holds itself
                raise TypeError(f"Fail(result=...) must be JSON: {exc}") from exc
        super().__init__(message)
        self.retryable = retryable
        self.result = result


class JobContext(abc.ABC):
    """What a handler is given: its job, and the fenced operations it may use on it.

    Every write goes through the attempt's fence: once the lease is lost (another delivery took
    the attempt over), `progress` answers False and the handler is cancelled. An abort cancels
    the handler after a short grace (`aborted` turns True first).
    """

    job_id: str
    """The id the job's organization knows it by."""
    agent_id: str
    kind: str
    attempt: int
    max_attempts: int
    organization_id: str | None
    session_key: str | None

    @property
    @abc.abstractmethod
    def payload(self) -> Mapping[str, Any]:
        """The job's payload as enqueued (`kind`, `authContext` and the handler's own fields)."""

    @property
    @abc.abstractmethod
    def aborted(self) -> bool:
        """True once an abort has arrived: stop promptly (the handler is cancelled soon)."""

    @abc.abstractmethod
    async def progress(self, data: Any) -> bool:
        """Record progress (a string or any JSON value) as a `job.progress` receipt. Receipts
        are written at most every half second: a call in between is kept (and answers True),
        the latest wins, and the last is written before the job settles, however the handler
        ends. False when the fence refused the write: the lease is lost and the handler is
        about to be cancelled. `data` that is not JSON raises TypeError at the call."""

    @abc.abstractmethod
    def time_left(self) -> float:
        """Seconds until the attempt's execution timeout cancels the handler (`math.inf`: not
        known). An installed handler has the job's lease less a second (`JOB_LEASE_MS`, 300 s by
        default) however the job's `timeoutMs` reads: split longer work into jobs, or `Retry`."""

    @abc.abstractmethod
    def commands(self, *, wait: bool = True) -> AsyncIterator[Command]:
        """The job's steer and follow_up commands, in order, each consumed once. With `wait`
        it waits for more until the job is aborted; without, it ends when none is pending."""

    @abc.abstractmethod
    async def run_sandboxed(
        self,
        argv: list[str],
        *,
        stdin: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> SandboxRun:
        """Run `argv` (a list of strings) in the command sandbox, in the job's workspace, its
        output streamed as progress. Only a handler declared with `sandbox=True` may; the
        sandbox is the only way a handler runs a command its tenant chose, and its program is
        held to the organization's allow-list of executables (`RECEIPT_ORG_EXECUTABLES`) as a
        command a request names is. An argv, `env` or `stdin` it cannot run, or a program off
        the list, raises `Fail`."""


HandlerFunction = Callable[[JobContext], Awaitable[Any]]


@dataclass(frozen=True)
class AgentHandler:
    """A handler as `@handler` declares it: the agent id it runs, the payload kinds it takes,
    whether it runs commands in the sandbox, the worker group it runs on (None: where routing
    sends its jobs), and the function."""

    agent_id: str
    kinds: tuple[str, ...]
    function: HandlerFunction
    sandbox: bool = False
    group: str | None = None

    async def __call__(self, job: JobContext) -> Any:
        return await self.function(job)

    @property
    def name(self) -> str:
        """`module:qualname` of the function, for logs and errors."""
        module = getattr(self.function, "__module__", "?")
        return f"{module}:{getattr(self.function, '__qualname__', repr(self.function))}"


def handler(
    agent_id: str,
    *,
    kinds: Iterable[str] = DEFAULT_KINDS,
    sandbox: bool = False,
    group: str | None = None,
) -> Callable[[HandlerFunction], AgentHandler]:
    """Declare `async def f(job: JobContext)` the handler of `agent_id` for `kinds` (payload
    kinds; default `factory.task.run`). Its return value (JSON) is the job's result. With
    `group` (`chat`, `codex` or `control`) its jobs run on that worker group, whatever routing
    would pick; install it in the entry-point group `receipt.handlers.<group>` then. A handler
    that runs commands (`sandbox=True`) runs where the sandbox is: `group="codex"`."""
    if not isinstance(agent_id, str):
        raise TypeError(
            "@handler takes the agent id first: @handler('my-agent') above `async def`; "
            f"got {agent_id!r}"
        )
    if isinstance(kinds, str):
        raise ValueError(f"kinds of {agent_id!r} must be a list of payload kinds, not a string")
    if sandbox and group != "codex":
        raise ValueError(
            f"handler {agent_id!r} runs commands (sandbox=True): it runs on worker-codex, where "
            "the sandbox is; add group='codex'"
        )
    if group is not None and group not in GROUP_QUEUES:
        raise ValueError(
            f"group of {agent_id!r} must be one of {', '.join(GROUP_QUEUES)}; got {group!r}"
        )
    if not AGENT_ID.match(agent_id):
        raise ValueError(
            f"agent id {agent_id!r}: 1-100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    taken = tuple(dict.fromkeys(kinds))
    unknown = [kind for kind in taken if kind not in KINDS]
    if not taken or unknown:
        raise ValueError(
            f"kinds of {agent_id!r} must be payload kinds ({', '.join(KINDS)}); "
            f"got {', '.join(unknown) or 'none'}"
        )

    def declare(function: HandlerFunction) -> AgentHandler:
        if not _is_async(function):
            # A plain function would run on the worker's event loop (no heartbeat meanwhile),
            # its side effects done, before awaiting its result failed: refused where declared.
            raise TypeError(
                f"@handler({agent_id!r}) declares an `async def` function; "
                f"{getattr(function, '__qualname__', function)!r} is not one (run blocking "
                "work with `await asyncio.to_thread(...)` inside it)"
            )
        return AgentHandler(agent_id, taken, function, sandbox, group)

    return declare


def _is_async(function: Any) -> bool:
    """An `async def` function, or an object whose `__call__` is one."""
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
        type(function).__call__
    )
