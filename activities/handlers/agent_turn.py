"""One agent turn (queue job kind `agent_job.turn`): run the agent's command in the job's
workspace with the turn request on stdin, hand steers to it while it runs, and return its outcome
(the last JSON line of stdout) as the queue job's result. See docs/agent-jobs.md."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import deque
from pathlib import Path
from typing import Any

from activities.handlers import HandlerContext, HandlerError

# The codex handler's command runner: its argv wrapper (parent-death signal today, the command
# sandbox where configured) and its process-group stop. Agent turns are commands like any other.
from activities.handlers.codex import _stop as stop_command
from activities.handlers.codex import _wrapped as wrap_command
from receipts.agent_jobs import lifecycle, protocol
from receipts.agent_jobs.model import AgentJob
from receipts.agent_jobs.registry import (
    AgentDefinition,
    AgentJobSettings,
    RegistryError,
    load_registry,
)

log = logging.getLogger("activities.handlers.agent_turn")

STEER_POLL_S = 0.25
PROGRESS_INTERVAL_S = 0.5
TAIL_LINES = 200
ENV_PASSED = ("PATH", "LANG", "LC_ALL", "TZ")


def workspace_of(root: Path, job: AgentJob) -> Path:
    """The job's workspace: its owner's (itself, or the job it continues)."""
    return root.resolve() / job.workspace_owner_job_id


def prepare_workspace(root: Path, job: AgentJob, agent: AgentDefinition) -> Path:
    """Create the workspace if needed; write AGENTS.md on first initialisation only."""
    path = workspace_of(root, job)
    path.mkdir(parents=True, exist_ok=True)
    agents_md = path / "AGENTS.md"
    if not agents_md.exists():
        agents_md.write_text(protocol.compose_agents_md(job, agent, str(path)), encoding="utf-8")
        log.info(
            "agent workspace initialised",
            extra={"event": "agent_turn.workspace_initialised", "agentJobId": job.agent_job_id},
        )
    return path


def _env(agent: AgentDefinition, job: AgentJob, workspace: Path) -> dict[str, str]:
    # An allow-list: nothing of the worker's own environment (its secrets) reaches the agent.
    env = {name: os.environ[name] for name in ENV_PASSED if name in os.environ}
    env.setdefault("PATH", os.defpath)
    env.update(agent.env)
    env.update(
        HOME=str(workspace),
        RECEIPT_AGENT_JOB_ID=job.agent_job_id,
        RECEIPT_AGENT_WORKSPACE=str(workspace),
    )
    return env


async def run_agent_turn(ctx: HandlerContext) -> dict[str, Any]:
    """Run one turn and return its outcome (done / needs_input / failed / quota_exhausted)."""
    spec = ctx.payload.get("agentJob")
    if not isinstance(spec, dict) or not isinstance(spec.get("agentJobId"), str):
        raise HandlerError("payload.agentJob.agentJobId is required", retryable=False)
    job = await lifecycle.get(ctx.store, spec["agentJobId"])
    if job is None:
        raise HandlerError(f"no agent job {spec['agentJobId']!r}", retryable=False)
    try:
        agent = load_registry().get(job.agent_id)
    except RegistryError as exc:
        return _failed(str(exc))
    if agent is None:
        return _failed(f"agent {job.agent_id!r} is not in the agents registry", retryable=False)
    settings = AgentJobSettings()
    workspace = prepare_workspace(settings.workspaces, job, agent)
    request = protocol.turn_request(
        job,
        agent,
        attempt=int(spec.get("attempt", job.attempt)),
        turn=int(spec.get("turn", job.turn)),
        workspace=str(workspace),
    )
    env = _env(agent, job, workspace)
    try:
        process = await asyncio.create_subprocess_exec(
            *wrap_command(list(agent.command), str(workspace), env),
            cwd=str(workspace),
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        return _failed(f"could not start {agent.command[0]!r}: {exc}")
    outcome = await _converse(ctx, process, request)
    if outcome.get("outcome") == "done":
        follow_ups = await _consume_follow_ups(ctx)
        if follow_ups:
            outcome["followUps"] = follow_ups
    log.info(
        "agent turn finished",
        extra={
            "event": "agent_turn.outcome",
            "agentJobId": job.agent_job_id,
            "jobId": ctx.job.job_id,
            "outcome": outcome.get("outcome"),
            "exitCode": process.returncode,
        },
    )
    return outcome


def _failed(error: str, retryable: bool = True) -> dict[str, Any]:
    return {"outcome": "failed", "error": error, "retryable": retryable}


async def _converse(
    ctx: HandlerContext, process: asyncio.subprocess.Process, request: dict[str, Any]
) -> dict[str, Any]:
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    stdout_lines: deque[str] = deque(maxlen=TAIL_LINES)
    stderr_tail: deque[str] = deque(maxlen=20)
    unsent: list[str] = []
    last_sent = 0.0

    async def write(line: dict[str, Any]) -> bool:
        assert process.stdin is not None
        try:
            process.stdin.write((json.dumps(line, separators=(",", ":")) + "\n").encode())
            await process.stdin.drain()
            return True
        except (BrokenPipeError, ConnectionResetError):
            return False

    async def read_stdout() -> None:
        nonlocal last_sent
        assert process.stdout is not None
        while raw := await process.stdout.readline():
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            stdout_lines.append(line)
            unsent.append(line)
            if time.monotonic() - last_sent >= PROGRESS_INTERVAL_S:
                await ctx.progress({"output": "\n".join(unsent)[-8_000:]})
                unsent.clear()
                last_sent = time.monotonic()

    async def read_stderr() -> None:
        assert process.stderr is not None
        while raw := await process.stderr.readline():
            stderr_tail.append(raw.decode("utf-8", errors="replace").rstrip("\n"))

    async def steer() -> None:
        # Steers reach the running turn on stdin, each consumed once (queue.command.consumed).
        while True:
            for command in await ctx.pending_commands():
                if command.type != "steer":
                    continue
                if not await write(protocol.steer_line(command.command_id, command.payload)):
                    return
                await ctx.consume(command.command_id)
                log.info(
                    "steer handed to the turn",
                    extra={"event": "agent_turn.steered", "commandId": command.command_id},
                )
            await asyncio.sleep(STEER_POLL_S)

    readers: asyncio.Future[Any] = asyncio.gather(read_stdout(), read_stderr())
    steering = asyncio.create_task(steer())
    aborted: asyncio.Future[Any] = asyncio.create_task(ctx.aborted.wait())
    try:
        if not await write(request):
            log.warning("turn closed stdin before its request", extra={"event": "agent_turn.stdin"})
        done, _ = await asyncio.wait({readers, aborted}, return_when=asyncio.FIRST_COMPLETED)
        if aborted in done:
            await stop_command(process)
            raise HandlerError("aborted", retryable=False)
        await process.wait()
    finally:
        for task in (steering, aborted):
            task.cancel()
        if process.returncode is None:
            await stop_command(process)
        readers.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await readers
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await steering
    if unsent:
        await ctx.progress({"output": "\n".join(unsent)[-8_000:]})
    outcome = protocol.parse_outcome(stdout_lines, process.returncode)
    if outcome["outcome"] == "failed" and stderr_tail and "without an outcome" in outcome["error"]:
        outcome["error"] += "; stderr: " + " | ".join(stderr_tail)[-2_000:]
    return outcome


async def _consume_follow_ups(ctx: HandlerContext) -> list[Any]:
    """Follow-ups sent while the turn ran become the next turn's input."""
    taken: list[Any] = []
    for command in await ctx.pending_commands():
        if command.type == "follow_up" and await ctx.consume(command.command_id):
            taken.append(command.payload)
    return taken
