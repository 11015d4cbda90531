"""The `codex` handler: run a task's command in the sandbox, streaming its output."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from activities import workspaces
from activities.blocking import off_loop
from activities.handlers.context import HandlerContext, HandlerError
from activities.handlers.steering import StdinFeed
from activities.sandbox import SandboxNotStarted, SandboxRefused, SandboxSettings, run_sandboxed
from receipts.kinds import steerable_task
from receipts.tenancy import caller_id

PROGRESS_INTERVAL_S = 0.5
TAIL_LINES = 50
TAIL_CHARS = 8_000


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


def _extra_env(task: Mapping[str, Any]) -> dict[str, str]:
    extra = task.get("env") or {}
    if not isinstance(extra, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in extra.items()
    ):
        raise HandlerError("payload.task.env must map strings to strings", retryable=False)
    return dict(extra)


async def workspace_of(ctx: HandlerContext, settings: SandboxSettings) -> Path:
    """The job's workspace in its organization's tree (`activities/workspaces.py`): its
    objective's when the payload names one (`payload.objectiveId`), else its own. A workspace
    of the earlier layout is moved there first, once it is known to be the organization's: the
    objective of that id exists and is the job's organization's (the handler's `ctx.receipts` sees no
    other), or it is this very job's."""
    organization = ctx.job.organization_id
    objective_id = ctx.payload.get("objectiveId")
    if isinstance(objective_id, str) and objective_id:
        workspace = workspaces.objective_workspace(organization, objective_id, settings)
        earlier_id = caller_id(objective_id)
        legacy = workspaces.legacy_objective_workspace(earlier_id, settings)
        if legacy.is_dir() and await ctx.receipts.objective(earlier_id) is not None:
            await off_loop(workspaces.adopt, legacy, workspace, settings)
        return workspace
    workspace = workspaces.job_workspace(organization, ctx.job.job_id, settings)
    legacy = workspaces.legacy_job_workspace(ctx.job.job_id, settings)
    if legacy.is_dir():
        await off_loop(workspaces.adopt, legacy, workspace, settings)
    return workspace


class ProgressOutput:
    """A command's output as it arrives: the last TAIL_CHARS characters kept for the result,
    complete lines sent as throttled `job.progress` receipts (at most the last TAIL_CHARS of
    what arrived since the last one). Memory and work stay bounded by TAIL_CHARS per chunk
    whatever the command prints: a command printing without end costs a counted scan of each
    chunk, never a string per line."""

    def __init__(self, ctx: HandlerContext) -> None:
        self.ctx = ctx
        self.recent = ""  # the last TAIL_CHARS characters of the output
        self.unsent = ""  # complete lines not sent yet (their last TAIL_CHARS)
        self.partial = ""  # the line being written (its last TAIL_CHARS)
        self.lines = 0
        self.last_sent = 0.0

    async def write(self, text: str) -> None:
        self.lines += text.count("\n")
        self.recent = (self.recent + text[-TAIL_CHARS:])[-TAIL_CHARS:]
        cut = text.rfind("\n")
        if cut < 0:
            self.partial = (self.partial + text)[-TAIL_CHARS:]
        else:
            complete = text[: cut + 1][-TAIL_CHARS:]
            self.unsent = (self.unsent + self.partial + complete)[-TAIL_CHARS:]
            self.partial = text[cut + 1 :][-TAIL_CHARS:]
        if time.monotonic() - self.last_sent >= PROGRESS_INTERVAL_S:
            await self.flush()

    def end(self) -> None:
        if self.partial:
            self.unsent = (self.unsent + self.partial)[-TAIL_CHARS:]
            self.lines += 1
            self.partial = ""

    def tail(self) -> str:
        """The output's last TAIL_LINES lines, at most TAIL_CHARS characters (the result's)."""
        return "".join(self.recent.splitlines(keepends=True)[-TAIL_LINES:])[-TAIL_CHARS:]

    async def flush(self) -> None:
        if self.unsent:
            await self.ctx.progress({"output": self.unsent, "lines": self.lines})
            self.unsent = ""
        self.last_sent = time.monotonic()


def _stdin_of(ctx: HandlerContext, task: Mapping[str, Any]) -> StdinFeed | None:
    """The command's stdin: `payload.task.stdin` (a string, e.g. an objective task's prompt)
    first, then, when the task is steerable (`steerable: true`), each steer as a JSON line,
    consumed once (`activities/handlers/steering.py`); otherwise it is closed after the text.
    None: no text and no steers, the command's stdin is /dev/null."""
    text = task.get("stdin")
    if text is not None and not isinstance(text, str):
        raise HandlerError("payload.task.stdin must be a string", retryable=False)
    steers = steerable_task(ctx.payload)
    if text is None and not steers:
        return None
    return StdinFeed(ctx, (text or "").encode("utf-8"), steers=steers)


async def run_task(ctx: HandlerContext) -> dict[str, Any]:
    """Run `payload.task.command` (argv, no shell unless the argv asks for one) in the sandbox.

    It runs in the job's workspace (`payload.task.cwd` is relative to it) with a clean
    environment plus `payload.task.env`; the network is off unless the agent is in
    `RECEIPT_SANDBOX_EGRESS_AGENTS`. Its stdin gets `payload.task.stdin`, and steers when the
    task says `steerable: true`. Output is streamed as throttled `job.progress` receipts; the
    result carries the exit code and the output tail. A non-zero exit fails the job,
    non-retryably unless the payload says `"retryable": true`. An abort kills the sandbox.
    """
    task = ctx.payload.get("task")
    if not isinstance(task, Mapping):
        raise HandlerError("payload.task must be an object with a 'command'", retryable=False)
    argv = _argv(task)
    cwd = task.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise HandlerError("payload.task.cwd must be a string", retryable=False)
    extra = _extra_env(task)
    settings = ctx.settings.sandbox
    output = ProgressOutput(ctx)
    stdin = _stdin_of(ctx, task)
    try:
        ended = await run_sandboxed(
            argv,
            workspace=await workspace_of(ctx, settings),
            env=extra,
            cwd=cwd,
            network=ctx.job.agent_id in settings.egress_agents,
            on_output=output.write,
            aborted=ctx.aborted,
            settings=settings,
            feed_stdin=stdin.feed if stdin is not None else None,
        )
    except SandboxRefused as exc:
        raise HandlerError(str(exc), retryable=False) from exc
    except SandboxNotStarted as exc:
        raise HandlerError(str(exc), retryable=True) from exc
    finally:
        if stdin is not None:
            await stdin.consumed()
    if ended.aborted:
        raise HandlerError("aborted", retryable=False)
    output.end()
    await output.flush()
    result = {
        "exitCode": ended.exit_code,
        "outputTail": output.tail(),
        "lines": output.lines,
    }
    if ended.exit_code != 0 or ended.memory_limit:
        killed = " (a process was killed at the sandbox's memory limit)" * ended.memory_limit
        killed += " (killed: its workspace grew past its bound on disk)" * ended.disk_limit
        raise HandlerError(
            f"command exited with status {ended.exit_code}{killed}",
            retryable=bool(ctx.payload.get("retryable", False)),
            result=result,
        )
    return result
