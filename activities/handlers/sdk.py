"""The worker's side of `receipt_worker`: the `JobContext` a team's handler is given (over the
attempt's fenced handler context), and the installed handlers, loaded at a worker's start and
turned into handlers the attempt activity runs like the built-in ones.

Handlers are installed as entry points named by the agent id they run, in the group
`receipt.handlers` (they run where routing sends their jobs) or `receipt.handlers.<group>`
(they run on that worker group). A worker imports every one at start: one that fails to import,
is not a `@handler` of the agent id it is named by, or names another group than the one it is
installed in, is a load failure (the worker is not ready and takes no attempts); an agent id
both built in and installed, or installed twice, is a conflict (the role does not start).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from activities.handlers.codex import (
    PROGRESS_INTERVAL_S,
    ProgressOutput,
    workspace_of,
)
from activities.handlers.context import (
    Handler,
    HandlerContext,
    HandlerError,
    unsupported_kind_message,
)
from activities.handlers.steering import StdinFeed
from activities.sandbox import SandboxRefused, run_sandboxed
from receipt_worker.sdk import AgentHandler, Command, Fail, JobContext, Retry, SandboxRun
from receipts import metrics
from receipts.executables import first_refused
from receipts.kinds import AGENT_IDS, GROUP_QUEUES, handlers_entry_points
from receipts.tenancy import caller_id
from receipts.text import sanitize
from receipts.waits import within

COMMAND_POLL_S = 1.0
KEPT_PROGRESS_WRITE_S = 2.0
"""How long the progress kept back is given to be written when the handler ends: well inside
the 5 s a cancelled handler has before it is abandoned (activities/attempt.py)."""
MAX_PROGRESS_BYTES = 64 * 1024
MAX_RESULT_BYTES = 1024 * 1024
"""What a handler's progress (a receipt every half second at most) and its result (the job's
row, every read of it and its event stream) may weigh as JSON: a request body's default cap."""
MAX_JSON_DEPTH = 64
"""How deeply a handler's progress and result may nest: as a request body's default
(`RECEIPT_MAX_JSON_DEPTH`)."""
_NOTHING = object()

log = logging.getLogger(__name__)


class HandlerConflict(Exception):
    """Two handlers claim one agent id: the role cannot start."""


class FencedJobContext(JobContext):
    """A `JobContext` over the attempt's handler context: every write is fenced."""

    def __init__(self, ctx: HandlerContext, declared: AgentHandler) -> None:
        job = ctx.job
        self.job_id = caller_id(job.job_id)
        self.agent_id = job.agent_id
        self.kind = job.kind
        self.attempt = ctx.attempt
        self.max_attempts = job.max_attempts
        self.organization_id = job.organization_id
        self.session_key = caller_id(job.session_key) if job.session_key else None
        self._ctx = ctx
        self._declared = declared
        self._unsent: Any = _NOTHING
        self._last_sent = -math.inf
        self._later: asyncio.Task[None] | None = None
        # The loop's clock against the monotonic one: `time_left` is asked from the handler's
        # worker threads too (`asyncio.to_thread`, as the README advises), where no loop runs.
        self._loop_behind = time.monotonic() - asyncio.get_running_loop().time()

    @property
    def payload(self) -> Mapping[str, Any]:
        return self._ctx.payload

    @property
    def aborted(self) -> bool:
        return self._ctx.aborted.is_set()

    def time_left(self) -> float:
        deadline = self._ctx.deadline
        return math.inf if deadline is None else deadline + self._loop_behind - time.monotonic()

    async def progress(self, data: Any) -> bool:
        # Refused at the call whether it is written now or kept back: kept, it would fail only
        # when the handler ends, in place of the handler's own outcome.
        _check_json(data, "progress data", MAX_PROGRESS_BYTES)
        if time.monotonic() - self._last_sent < PROGRESS_INTERVAL_S:
            # Kept back, and written when the half second is up (not only at the handler's next
            # call, which a long step may not make for minutes).
            self._unsent = data
            if self._later is None or self._later.done():
                self._later = asyncio.create_task(self._write_later(), name="handler-progress")
            return True
        self._unsent = _NOTHING
        self._last_sent = time.monotonic()
        return await self._ctx.progress(data)

    async def _write_later(self) -> None:
        """Write what is kept back once the rate limit lets it, the latest kept meanwhile too."""
        while self._unsent is not _NOTHING:
            wait = self._last_sent + PROGRESS_INTERVAL_S - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            data, self._unsent = self._unsent, _NOTHING
            self._last_sent = time.monotonic()
            try:
                await self._ctx.progress(data)
            except asyncio.CancelledError:
                if self._unsent is _NOTHING:
                    self._unsent = data  # the handler's end writes it (`write_kept`)
                raise
            except Exception:
                self._unwritten()
                return

    async def flush(self) -> None:
        """Write the progress kept back by the rate limit, if any."""
        if self._later is not None and not self._later.done():
            self._later.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._later
        if self._unsent is not _NOTHING:
            data, self._unsent = self._unsent, _NOTHING
            await self._ctx.progress(data)

    async def write_kept(self) -> None:
        """`flush` however the handler ended (its result, `Retry`, `Fail`, an exception, the
        execution timeout, an abort): a failure to write is logged and counted, never the
        job's outcome in place of the handler's."""
        try:
            await within(self.flush(), KEPT_PROGRESS_WRITE_S)
        except Exception:
            self._unwritten()

    def _unwritten(self) -> None:
        metrics.HANDLER_PROGRESS_UNWRITTEN.labels(metrics.agent_label(self.agent_id)).inc()
        log.warning(
            "the progress a handler's rate limit kept back was not written",
            exc_info=True,
            extra={"event": "handler.progress_unwritten", "jobId": self.job_id},
        )

    async def commands(self, *, wait: bool = True) -> AsyncIterator[Command]:
        arrived = self._ctx.commands_arrived
        while True:
            for command in await self._ctx.pending_commands():
                if await self._ctx.consume(command.command_id):
                    yield Command(command.command_id, command.type, command.payload)
            if not wait or self.aborted:
                return
            with contextlib.suppress(TimeoutError):
                await within(arrived.wait(), COMMAND_POLL_S)
            arrived.clear()

    async def run_sandboxed(
        self,
        argv: list[str],
        *,
        stdin: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> SandboxRun:
        if not self._declared.sandbox:
            raise Fail(
                f"handler {self._declared.name} runs no commands: declare it with "
                "@handler(..., sandbox=True)"
            )
        _check_command(argv, stdin, env, cwd)
        ctx = self._ctx
        if ctx.aborted.is_set():  # an abort, or the attempt is over: nothing starts now
            raise Fail("aborted")
        allowed = ctx.settings.factory.org_executables.get(ctx.job.organization_id or "")
        refused = first_refused(allowed, [("argv", list(argv))])
        if refused is not None:  # the handler chose it, maybe from the tenant's payload
            raise Fail(refused[1])
        settings = ctx.settings.sandbox
        output = ProgressOutput(ctx)
        feed = StdinFeed(ctx, stdin.encode("utf-8"), steers=False) if stdin is not None else None
        try:
            ended = await run_sandboxed(
                list(argv),
                workspace=await workspace_of(ctx, settings),
                env=dict(env or {}),
                cwd=cwd,
                network=self.agent_id in settings.egress_agents,
                on_output=output.write,
                aborted=ctx.aborted,
                settings=settings,
                feed_stdin=feed.feed if feed is not None else None,
            )
        except SandboxRefused as exc:
            raise Fail(str(exc)) from exc
        if ended.aborted:
            raise Fail("aborted")
        output.end()
        await output.flush()
        return SandboxRun(ended.exit_code, output.tail(), output.lines, ended.memory_limit)


def as_handler(declared: AgentHandler) -> Handler:
    """The attempt activity's handler for a `@handler`: the kinds it takes, `Retry` and `Fail`
    as the failures they name, its return value (JSON) as the job's result."""

    async def handle(ctx: HandlerContext) -> Any:
        if ctx.job.kind not in declared.kinds:
            raise HandlerError(
                unsupported_kind_message(declared.agent_id, ctx.job.kind), retryable=False
            )
        job = FencedJobContext(ctx, declared)
        try:
            value = await declared(job)
        except (SystemExit, KeyboardInterrupt) as exc:
            # `sys.exit` (argparse on bad input, click) would end the worker's event loop and
            # every attempt it runs: the handler's failure only, retried as an exception is.
            await job.write_kept()
            message = f"{type(exc).__name__}: {exc} (a handler may not end its worker)"
            raise HandlerError(message, retryable=True) from None
        except Retry as exc:
            await job.write_kept()
            raise HandlerError(str(exc), retryable=True, retry_delay_ms=exc.delay_ms) from exc
        except Fail as exc:
            await job.write_kept()
            raise _failed(exc) from exc
        except asyncio.CancelledError:
            # Cancelled by the execution timeout or an abort the fence still holds (after a lost
            # lease the fenced write is refused): the last progress says where it stopped.
            await job.write_kept()
            raise
        except Exception:
            # The handler's own error is the one reported.
            await job.write_kept()
            raise
        await job.write_kept()
        try:
            _check_json(value, f"the result of {declared.name}", MAX_RESULT_BYTES)
        except TypeError as exc:
            raise HandlerError(str(exc), retryable=False) from exc
        return value

    return handle


def _check_shape(value: Any, what: str, limit: int) -> None:
    """Refuse `value` when its lists and objects nest past `MAX_JSON_DEPTH` or it weighs more
    than `limit`: each value a byte of JSON at least, each character of a string, a key or
    bytes one more. Walked once, iteratively, never past either bound and before anything is
    serialized: a value that holds itself (which no JSON does), one list many times over, or a
    100 MB string (serialized first, it held the worker's event loop 4 s and took 1.2 GB to be
    refused) is refused at once rather than walked or copied on the worker's event loop."""
    pending, weight = [(value, 1)], 0
    while pending:
        item, level = pending.pop()
        weight += len(item) if isinstance(item, (str, bytes, bytearray)) else 1
        if isinstance(item, dict) and weight + len(item) <= limit:
            weight += sum(len(key) for key in item if isinstance(key, (str, bytes)))
            item = list(item.values())
        elif isinstance(item, dict):
            weight += len(item)
        if weight > limit or (isinstance(item, (list, tuple)) and weight + len(item) > limit):
            raise TypeError(
                f"{what} holds more than {limit} values and characters (over {limit} bytes "
                f"of JSON); at most {limit} are kept"
            )
        if isinstance(item, (list, tuple)):
            if level > MAX_JSON_DEPTH:
                raise TypeError(
                    f"{what} nests more than {MAX_JSON_DEPTH} levels deep; "
                    f"at most {MAX_JSON_DEPTH} are kept"
                )
            pending.extend((child, level + 1) for child in item)


def _check_json(value: Any, what: str, limit: int) -> None:
    """Refuse what the store cannot write, or should not: JSON once sanitized as a write is
    (bytes decoded, keys made strings, NaN as null: receipts/text.py `sanitize`), at most
    `limit` bytes and `MAX_JSON_DEPTH` levels (the job's state is serialized by pydantic,
    which refuses 255; the api refuses request bodies deeper than 64)."""
    _check_shape(value, what, limit)
    try:
        size = len(json.dumps(sanitize(value)).encode())
    except (TypeError, ValueError, RecursionError) as exc:
        raise TypeError(f"{what} is not JSON: {exc}") from exc
    if size > limit:
        raise TypeError(f"{what} is {size} bytes of JSON; at most {limit} are kept")


def _check_command(argv: Any, stdin: Any, env: Any, cwd: Any) -> None:
    """`run_sandboxed`'s arguments as it can run them, else `Fail` naming the one it cannot."""
    if isinstance(argv, str) or not isinstance(argv, (list, tuple)) or not argv:
        raise Fail("run_sandboxed(argv): a non-empty list of strings (no shell), not a string")
    if not all(isinstance(part, str) for part in argv):
        raise Fail("run_sandboxed(argv): every part must be a string")
    if stdin is not None and not isinstance(stdin, str):
        raise Fail("run_sandboxed(stdin=...): a string")
    if env is not None and not (
        isinstance(env, Mapping)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise Fail("run_sandboxed(env=...): a mapping of strings to strings")
    if cwd is not None and not isinstance(cwd, str):
        raise Fail("run_sandboxed(cwd=...): a path relative to the job's workspace")


def _failed(exc: Fail) -> HandlerError:
    """The failure a `Fail` names; a result that is not JSON (changed after `Fail` checked it)
    or too large is dropped, and the message says so, rather than failing the settle."""
    try:
        _check_json(exc.result, "its result", MAX_RESULT_BYTES)
    except TypeError as refused:
        return HandlerError(f"{exc} ({refused}; dropped)", retryable=exc.retryable)
    return HandlerError(str(exc), retryable=exc.retryable, result=exc.result)


@dataclass(frozen=True)
class Installed:
    """The installed handlers a worker loaded (agent id → handler, with what each is), and
    why the others could not be loaded."""

    handlers: Mapping[str, Handler]
    loaded: Mapping[str, str]
    failures: tuple[str, ...]


def _origin(point: EntryPoint) -> str:
    dist = point.dist
    named = f" of {dist.name} {dist.version}" if dist is not None else ""
    return f"entry point {point.group} {point.name} = {point.value}{named}"


def installed_points() -> list[EntryPoint]:
    """The entry points of every handler group, the routed one first."""
    groups = (None, *GROUP_QUEUES)
    return [p for group in groups for p in entry_points(group=handlers_entry_points(group))]


def _group_of(point: EntryPoint) -> str | None:
    return next((g for g in GROUP_QUEUES if point.group == handlers_entry_points(g)), None)


def load_installed(points: Iterable[EntryPoint] | None = None) -> Installed:
    """Import the handlers installed as entry points (`points`: those of the handler groups).
    Raises `HandlerConflict` when an agent id is built in and installed, or installed twice."""
    points = installed_points() if points is None else list(points)
    seen: dict[str, EntryPoint] = {}
    for point in points:
        if point.name in AGENT_IDS:
            raise HandlerConflict(
                f"agent id {point.name!r} is both built in (activities/handlers/registry.py) "
                f"and installed ({_origin(point)})"
            )
        earlier = seen.get(point.name)
        if earlier is not None and (earlier.value, earlier.group) != (point.value, point.group):
            raise HandlerConflict(
                f"agent id {point.name!r} is installed twice: {_origin(seen[point.name])} "
                f"and {_origin(point)}"
            )
        seen[point.name] = point
    handlers: dict[str, Handler] = {}
    loaded: dict[str, str] = {}
    failures: list[str] = []
    for name, point in seen.items():
        try:
            declared = point.load()
        except Exception as exc:
            failures.append(f"{_origin(point)}: {type(exc).__name__}: {exc}")
            continue
        if not isinstance(declared, AgentHandler) or declared.agent_id != name:
            what = (
                f"a handler of agent {declared.agent_id!r}"
                if isinstance(declared, AgentHandler)
                else "not a @handler"
            )
            failures.append(f"{_origin(point)}: it is {what}")
            continue
        if declared.group != _group_of(point):
            failures.append(
                f"{_origin(point)}: it names the worker group {declared.group or '(routed)'}; "
                f"install it in the entry-point group {handlers_entry_points(declared.group)}"
            )
            continue
        handlers[name] = as_handler(declared)
        details = [f"kinds {', '.join(declared.kinds)}"]
        details += ["sandboxed"] * declared.sandbox + [f"group {declared.group}"] * bool(
            declared.group
        )
        loaded[name] = f"{declared.name} ({', '.join(details)})"
    return Installed(handlers, loaded, tuple(failures))
