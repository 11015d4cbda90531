"""One agent turn (queue job kind `agent_job.turn`): run the agent's command in the job's
workspace with the turn request on stdin, hand steers to it while it runs, and return its outcome
(the last JSON line of stdout) as the queue job's result. See docs/agent-jobs.md."""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections import deque
from datetime import datetime
from pathlib import Path
from typing import Any

from activities import workspaces
from activities.gateway import Grant
from activities.handlers.codex import PROGRESS_INTERVAL_S
from activities.handlers.context import HandlerContext, HandlerError
from activities.handlers.steering import StdinFeed, encoded
from activities.sandbox import (
    SandboxNotStarted,
    SandboxRefused,
    SandboxSettings,
    run_sandboxed,
)
from activities.sandbox_gateway import Access, free_port
from receipts.agent_jobs import protocol
from receipts.agent_jobs.metrics import AGENT_JOB_EVENTS
from receipts.agent_jobs.model import AgentJob
from receipts.agent_jobs.registry import AgentDefinition, RegistryError, load_registry

log = logging.getLogger("activities.handlers.agent_turn")

TAIL_LINES = 200
# A line is kept up to 1 MiB (an outcome line longer than that is cut, so it is no outcome: as a
# handler's result, at most 1 MiB), the lines kept at most 4 MiB together, and the output not
# yet sent as progress at most PROGRESS_CHARS: a command printing without newlines held all of
# it, its every chunk re-joined and re-split (64 MiB took 32 s of the event loop).
MAX_LINE_CHARS = 1024 * 1024
MAX_HELD_CHARS = 4 * MAX_LINE_CHARS
PROGRESS_CHARS = 8_000
# The failure a `quota_exhausted` the model gateway did not see becomes (retryable, counted).
UNSEEN_QUOTA = "the command reported quota_exhausted, but the model gateway saw no quota"


def workspace_of(job: AgentJob, settings: SandboxSettings) -> Path:
    """The job's workspace, `<root>/orgs/<organization>/agent-jobs/<workspaceOwnerJobId>`: its
    own, or that of the job it continues (of the same organization: create checks it)."""
    return workspaces.agent_job_workspace(job.organization_id, job.workspace_owner_job_id, settings)


def initialise_workspace(job: AgentJob, agent: AgentDefinition, settings: SandboxSettings) -> Path:
    """Create the workspace (owned by the sandbox's uid; one of the earlier layout is moved
    into place) and, on first initialisation only, write AGENTS.md."""
    workspace = workspace_of(job, settings)
    legacy = workspaces.legacy_agent_job_workspace(job.workspace_owner_job_id, settings)
    workspaces.adopt(legacy, workspace, settings)
    uid = workspaces.prepare_workspace(workspace, settings)
    text = protocol.compose_agents_md(job, agent, str(workspace))
    if _create_file(workspace / "AGENTS.md", text.encode("utf-8"), uid):
        log.info(
            "agent workspace initialised",
            extra={"event": "agent_turn.workspace_initialised", "agentJobId": job.agent_job_id},
        )
    return workspace


def _create_file(path: Path, content: bytes, uid: int | None) -> bool:
    """Create `path` with `content` (owned by `uid`) unless something is there already; whether
    it was created. The workspace is the commands': whatever they left at `path` — a file, or a
    symbolic link to anywhere on the host — is never followed nor written through (O_EXCL with
    O_CREAT refuses an existing name, a dangling link included; the owner is set on the open
    file, not by name; the link into place follows no link and refuses an existing name).

    Whole or not at all: the content is written under a name of its own beside `path`
    (`.<name>.<random>.partial`) and linked to `path` only once whole. Created first and written
    after, a worker that died in between (or a write that failed: the disk full) left `path`
    empty or cut, and every later turn found it there and kept it. A write that fails removes
    its partial file; a killed worker's is left hidden beside it, and `path` is still to make."""
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(partial, flags, 0o644)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(content)
            if uid is not None:
                os.fchown(file.fileno(), uid, uid)
        try:
            os.link(partial, path, follow_symlinks=False)
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)


async def run_agent_turn(ctx: HandlerContext) -> dict[str, Any]:
    """Run one turn in the command sandbox and return its outcome (done / needs_input /
    failed / quota_exhausted)."""
    spec = ctx.payload.get("agentJob")
    if not isinstance(spec, dict) or not isinstance(spec.get("agentJobId"), str):
        raise HandlerError("payload.agentJob.agentJobId is required", retryable=False)
    job = await ctx.receipts.agent_job(spec["agentJobId"])
    if job is None:
        raise HandlerError(f"no agent job {spec['agentJobId']!r}", retryable=False)
    if job.status != "running" or job.queue_job_id != ctx.job.job_id:
        # Stopped (or moved on) before this delivery started: a cancel acknowledged while the
        # turn was leased (a redelivery after its worker died, a slow start) left it to end on
        # its own, not to run the agent's command for a job that no longer runs.
        AGENT_JOB_EVENTS.labels("turn_not_run").inc()
        return _ended_early(
            ctx,
            job,
            f"agent job {job.agent_job_id!r} is {job.status}, not running this turn",
            retryable=False,
        )
    try:
        agent = load_registry(ctx.settings.agent_jobs.agents_file).get(job.agent_id)
    except RegistryError as exc:
        return _ended_early(ctx, job, str(exc))
    if agent is None:
        return _ended_early(
            ctx, job, f"agent {job.agent_id!r} is not in the agents registry", retryable=False
        )
    try:
        settings = ctx.settings.sandbox
        workspace = initialise_workspace(job, agent, settings)
    except (ValueError, SandboxRefused, OSError) as exc:
        return _ended_early(ctx, job, f"the workspace could not be prepared: {exc}")
    request = protocol.turn_request(
        job,
        agent,
        attempt=int(spec.get("attempt", job.attempt)),
        turn=int(spec.get("turn", job.turn)),
        workspace=str(workspace),
    )
    turn = _Turn(ctx)
    stdin = StdinFeed(ctx, encoded(request), steers=True)
    env = {**agent.env, "AGENT_JOB_ID": job.agent_job_id}
    grant, access = _model_access(ctx, job, agent)
    if grant is not None and access is not None:
        env.update(access.env(grant.token))
    try:
        ended = await run_sandboxed(
            list(agent.command),
            workspace=workspace,
            env=env,
            network=job.agent_id in settings.egress_agents,
            on_output=turn.output,
            aborted=ctx.aborted,
            settings=settings,
            feed_stdin=stdin.feed,
            gateway=access,
        )
        if grant is not None and ctx.gateway is not None and not ended.aborted:
            # The command ended: its token opens nothing any more, and the calls it left running
            # are waited for (a while), so that what they cost is in the turn's usage.
            await ctx.gateway.drain(grant)
    except SandboxRefused as exc:
        return _ended_early(ctx, job, str(exc), retryable=False)
    except SandboxNotStarted as exc:
        return _ended_early(ctx, job, str(exc))
    finally:
        if grant is not None and ctx.gateway is not None:
            # Revoked however the turn ended (idempotent after a drain); a cancelled or aborted
            # one waits for nothing (the attempt gives a cancelled handler 5 s before it counts
            # it abandoned, and it writes no usage summary).
            ctx.gateway.revoke(grant)
        await stdin.consumed()
    if ended.aborted:
        raise HandlerError("aborted", retryable=False)
    outcome = _as_the_gateway_saw(await turn.outcome(ended.exit_code), grant)
    # Follow-ups sent while the turn ran reach the next turn whatever this one's outcome: the
    # settlement carries them (receipts/agent_jobs/decisions.py), read from their receipts. The
    # result names them, never copies them: it is the queue job's, in every read of it.
    read = await _consume_follow_ups(ctx)
    if read:
        outcome[protocol.FOLLOW_UPS_READ] = read
    log.info(
        "agent turn finished",
        extra={
            "event": "agent_turn.outcome",
            "agentJobId": job.agent_job_id,
            "jobId": ctx.job.job_id,
            "outcome": outcome.get("outcome"),
            "exitCode": ended.exit_code,
        },
    )
    return outcome


def _model_access(
    ctx: HandlerContext, job: AgentJob, agent: AgentDefinition
) -> tuple[Grant | None, Access | None]:
    """The turn's grant at the AI gateway for the binding the job saved at creation (an older
    job without one: the agent's), and the command's way to it; none without a gateway or a
    binding (the command then has no model access through Receipt)."""
    binding = job.provider_binding or agent.provider_binding
    gateway = ctx.gateway
    if gateway is None or binding is None:
        return None, None
    grant = gateway.grant(
        job_id=ctx.job.job_id,
        attempt=ctx.attempt,
        agent_id=job.agent_id,
        organization_id=job.organization_id,
        binding=binding,
    )
    assert grant.socket is not None
    return grant, Access(grant.socket, free_port())


def _as_the_gateway_saw(outcome: dict[str, Any], grant: Grant | None) -> dict[str, Any]:
    """The turn's outcome with what its model calls met (`grant`: none without the gateway).

    Quota with a recovery time makes it `quota_exhausted` until then whatever the command
    reported (unless it finished or asked its user anyway). Only that is a placement delay, with
    its attempt refunded (the specification: "AIGateway quota exhaustion with a known pool
    recovery time"): a `quota_exhausted` the gateway did not see — the command's word alone —
    is an ordinary failure, so no command can requeue its job for ever at no cost to its budget.
    A dead pool is named in a failure; the calls' usage rides along."""
    quota_until = grant.quota_until if grant is not None else None
    if quota_until is not None and outcome["outcome"] in ("failed", "quota_exhausted"):
        if isinstance(outcome.get("retryAt"), str):
            quota_until = max(quota_until, datetime.fromisoformat(outcome["retryAt"]))
        outcome = {"outcome": "quota_exhausted", "retryAt": quota_until.isoformat()}
    elif outcome["outcome"] == "quota_exhausted":
        outcome = _failed(UNSEEN_QUOTA)
    if grant is None:
        return outcome
    if grant.dead_pool is not None and outcome["outcome"] == "failed":
        outcome = {**outcome, "error": f"{outcome['error']}; model gateway: {grant.dead_pool}"}
    if grant.calls:
        outcome["usage"] = grant.summary()
    return outcome


def _ended_early(
    ctx: HandlerContext, job: AgentJob, error: str, *, retryable: bool = True
) -> dict[str, Any]:
    """A turn that failed before its command ran (the registry, the agent, the workspace, the
    sandbox): logged as every turn's outcome is, with why."""
    log.warning(
        "agent turn failed before its command ran: %s",
        error,
        extra={
            "event": "agent_turn.outcome",
            "agentJobId": job.agent_job_id,
            "jobId": ctx.job.job_id,
            "outcome": "failed",
            "error": error,
            "retryable": retryable,
        },
    )
    return _failed(error, retryable)


def _failed(error: str, retryable: bool = True) -> dict[str, Any]:
    return {"outcome": "failed", "error": error, "retryable": retryable}


class _Turn:
    """One running turn's output lines (its stdin is a `StdinFeed`)."""

    def __init__(self, ctx: HandlerContext) -> None:
        self.ctx = ctx
        self.lines: deque[str] = deque()
        self.held = 0  # characters in `lines`
        self.partial = ""
        self.unsent: deque[str] = deque()
        self.unsent_chars = 0
        self.last_sent = 0.0

    async def output(self, text: str) -> None:
        """Collect output lines (stdout and stderr), streamed as throttled `job.progress`;
        bounded (MAX_LINE_CHARS, MAX_HELD_CHARS, PROGRESS_CHARS) however much is printed."""
        *complete, rest = text.split("\n")
        if complete:
            complete[0] = self._grown(complete[0])
            self.partial = ""
        self.partial = self._grown(rest)
        for line in complete:
            self._keep(line[:MAX_LINE_CHARS])
        if time.monotonic() - self.last_sent >= PROGRESS_INTERVAL_S:
            await self._flush()

    def _grown(self, piece: str) -> str:
        """The line being read, `piece` added while it is under MAX_LINE_CHARS."""
        if len(self.partial) >= MAX_LINE_CHARS:
            return self.partial
        return (self.partial + piece)[:MAX_LINE_CHARS]

    def _keep(self, line: str) -> None:
        self.lines.append(line)
        self.held += len(line)
        while len(self.lines) > TAIL_LINES or (self.held > MAX_HELD_CHARS and len(self.lines) > 1):
            self.held -= len(self.lines.popleft())
        self.unsent.append(line[-PROGRESS_CHARS:])
        self.unsent_chars += len(self.unsent[-1])
        while self.unsent_chars > PROGRESS_CHARS and len(self.unsent) > 1:
            self.unsent_chars -= len(self.unsent.popleft())

    async def _flush(self) -> None:
        if self.unsent:
            await self.ctx.progress({"output": "\n".join(self.unsent)[-PROGRESS_CHARS:]})
            self.unsent.clear()
            self.unsent_chars = 0
        self.last_sent = time.monotonic()

    async def outcome(self, exit_code: int | None) -> dict[str, Any]:
        """The outcome: the last JSON line with `outcome` (see `protocol.parse_outcome`)."""
        if self.partial:
            self._keep(self.partial)
            self.partial = ""
        await self._flush()
        outcome = protocol.parse_outcome(self.lines, exit_code)
        if outcome["outcome"] == "failed" and "without an outcome" in outcome["error"]:
            outcome["error"] += "; output tail: " + " | ".join(list(self.lines)[-5:])[-2_000:]
        return outcome


async def _consume_follow_ups(ctx: HandlerContext) -> list[str]:
    """Follow-ups sent while the turn ran become the next turn's input: the ids of those read."""
    taken: list[str] = []
    for command in await ctx.pending_commands():
        if command.type == "follow_up" and await ctx.consume(command.command_id):
            taken.append(command.command_id)
    return taken
