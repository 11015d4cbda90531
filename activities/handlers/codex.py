"""The `codex` handler: run a task's command as a real subprocess, streaming its output."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import shutil
import signal
import sys
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from activities.handlers import HandlerContext, HandlerError

PROGRESS_INTERVAL_S = 0.5
TAIL_LINES = 50
TAIL_CHARS = 8_000
TERM_GRACE_S = 5.0
READ_CHUNK = 65_536

# The command dies with its worker: util-linux `setpriv --pdeathsig KILL` sets the kernel's
# parent-death signal and execs the command, so a SIGKILLed worker leaves no command running
# on behind its redelivery. A `preexec_fn` could do the same, but it runs Python in the forked
# child of a threaded process, which froze a worker once (a lock held across fork). Only the
# command itself is covered; processes it starts are its own to stop (`_stop` signals its whole
# process group on abort and shutdown). Without setpriv (not Linux) commands run unwrapped.
SETPRIV = shutil.which("setpriv") if sys.platform.startswith("linux") else None


def _wrapped(argv: list[str], cwd: str | None, env: Mapping[str, str]) -> list[str]:
    """`argv` behind `setpriv --pdeathsig KILL --` where setpriv exists.

    The executable is looked up first, so a missing one is still the handler's clear error
    (`could not start …`) rather than setpriv's exit status 127.
    """
    if not SETPRIV:
        return argv
    program = argv[0]
    if "/" in program:
        path = os.path.join(cwd or ".", program)
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise OSError(f"no executable file at {path}")
    elif shutil.which(program, path=env.get("PATH", os.defpath)) is None:
        raise OSError(f"not found on PATH {env.get('PATH', os.defpath)!r}")
    return [SETPRIV, "--pdeathsig", "KILL", "--", *argv]


def _argv(task: Mapping[str, Any]) -> list[str]:
    command = task.get("command")
    if (
        not isinstance(command, list)
        or not command
        or not all(isinstance(part, str) for part in command)
    ):
        raise HandlerError(
            "payload.task.command must be a non-empty list of strings (argv)", retryable=False
        )
    return list(command)


def _env(task: Mapping[str, Any]) -> dict[str, str]:
    env = dict(os.environ)
    extra = task.get("env") or {}
    if not isinstance(extra, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in extra.items()
    ):
        raise HandlerError("payload.task.env must map strings to strings", retryable=False)
    env.update(extra)
    return env


async def _stop(process: asyncio.subprocess.Process) -> None:
    """SIGTERM the process group, then SIGKILL it after a grace period."""
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), TERM_GRACE_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()


async def run_task(ctx: HandlerContext) -> dict[str, Any]:
    """Run `payload.task.command` (argv, no shell unless the argv asks for one).

    Output is streamed as throttled `job.progress` receipts; the result carries the exit code
    and the output tail. A non-zero exit fails the job, non-retryably unless the payload says
    `"retryable": true`. An abort stops the process: SIGTERM, then SIGKILL.
    """
    task = ctx.payload.get("task")
    if not isinstance(task, Mapping):
        raise HandlerError("payload.task must be an object with a 'command'", retryable=False)
    argv = _argv(task)
    cwd = task.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise HandlerError("payload.task.cwd must be a string", retryable=False)
    env = _env(task)
    try:
        process = await asyncio.create_subprocess_exec(
            *_wrapped(argv, cwd, env),
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        raise HandlerError(f"could not start {argv[0]!r}: {exc}", retryable=False) from exc

    tail: deque[str] = deque(maxlen=TAIL_LINES)
    lines_seen = 0
    last_sent = 0.0
    unsent: list[str] = []

    async def flush() -> None:
        nonlocal last_sent
        if unsent:
            await ctx.progress({"output": "".join(unsent)[-TAIL_CHARS:], "lines": lines_seen})
            unsent.clear()
        last_sent = time.monotonic()

    async def pump() -> None:
        # Read chunks, not lines: a single line longer than the stream's buffer must neither
        # break the pump nor leave the child blocked on a full pipe.
        nonlocal lines_seen
        assert process.stdout is not None
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        partial = ""
        while chunk := await process.stdout.read(READ_CHUNK):
            text = partial + decoder.decode(chunk)
            *lines, partial = text.split("\n")
            partial = partial[-TAIL_CHARS:]
            for line in lines:
                tail.append(line[-TAIL_CHARS:] + "\n")
                unsent.append(line[-TAIL_CHARS:] + "\n")
                lines_seen += 1
            if time.monotonic() - last_sent >= PROGRESS_INTERVAL_S:
                await flush()
        if partial:
            tail.append(partial)
            unsent.append(partial)
            lines_seen += 1

    pump_task = asyncio.create_task(pump())
    abort_task = asyncio.create_task(ctx.aborted.wait())
    try:
        done, _ = await asyncio.wait({pump_task, abort_task}, return_when=asyncio.FIRST_COMPLETED)
        if abort_task in done:
            await _stop(process)
            raise HandlerError("aborted", retryable=False)
        await process.wait()
        await flush()
    finally:
        abort_task.cancel()
        if process.returncode is None:
            await _stop(process)
        pump_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await pump_task

    output = "".join(tail)[-TAIL_CHARS:]
    result = {"exitCode": process.returncode, "outputTail": output, "lines": lines_seen}
    if process.returncode != 0:
        raise HandlerError(
            f"command exited with status {process.returncode}",
            retryable=bool(ctx.payload.get("retryable", False)),
            result=result,
        )
    return result
