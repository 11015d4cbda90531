"""What a handler is given and may raise: the job's context, the settings of what it runs, and
`HandlerError`; the shape every agent handler has (`Handler`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from activities.gateway import Gateway
from activities.handlers.fenced import FencedReceipts
from activities.sandbox_policy import SandboxSettings
from receipts.agent_jobs.registry import AgentJobSettings
from receipts.commands import QueuedCommand
from receipts.enqueue import OrgCaps
from receipts.jobs import Job
from receipts.objectives.watchdog import WatchdogSettings
from receipts.settings import FactorySettings
from receipts.timing import TimingSettings


class HandlerError(Exception):
    """A handler failed; `retryable` decides whether the job is attempted again, not before
    `retry_delay_ms` (clamped to 30 s) when given."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        result: Any = None,
        retry_delay_ms: int | None = None,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.result = result
        self.retry_delay_ms = retry_delay_ms


@dataclass(frozen=True)
class HandlerSettings:
    """The settings of what handlers run, read once by their process (roles/infra/settings.py)
    and handed to every job's handler; a handler never reads the environment."""

    sandbox: SandboxSettings = field(default_factory=SandboxSettings)
    factory: FactorySettings = field(default_factory=FactorySettings)
    watchdog: WatchdogSettings = field(default_factory=WatchdogSettings)
    timing: TimingSettings = field(default_factory=TimingSettings)
    agent_jobs: AgentJobSettings = field(default_factory=AgentJobSettings)
    # The organizations' caps of open jobs as the api reads them: objective control's task
    # dispatch is held to them (None: not held).
    org_caps: OrgCaps | None = None


@dataclass
class HandlerContext:
    """What a handler gets: the job, its payload, progress, pending commands, an abort signal
    and `receipts`, the named operations it may use on the receipts (`activities/handlers/fenced.py`).

    `progress(data)` appends a fenced `job.progress`; `pending_commands()` lists the steer and
    follow_up commands not yet consumed (read from the receipts, never Temporal signals) and
    `consume(command_id)` appends a fenced `queue.command.consumed`; `commands_arrived` is set
    when the attempt hears a command appended to the job (a hint to look again: clear it, then
    read). `aborted` is set when an abort command arrives; a handler should stop promptly — it
    is cancelled after a short grace. `deadline` is the event-loop time of the attempt's
    execution timeout (None: not known); a handler that outlives it is cancelled. `settings`
    are its process's settings of what handlers run; `gateway` its process's AI gateway (the
    roles that run agent turns have one).
    """

    job: Job
    attempt: int
    worker_id: str
    receipts: FencedReceipts
    settings: HandlerSettings = field(default_factory=HandlerSettings)
    aborted: asyncio.Event = field(default_factory=asyncio.Event)
    commands_arrived: asyncio.Event = field(default_factory=asyncio.Event)
    deadline: float | None = None
    gateway: Gateway | None = None

    @property
    def payload(self) -> dict[str, Any]:
        """The job's payload."""
        return self.job.payload

    async def progress(self, data: Any) -> bool:
        """Append `job.progress` under the fence; False once the lease is lost."""
        return await self.receipts.progress(data)

    async def consume(self, command_id: str) -> bool:
        """Mark a pending command consumed under the fence; False when refused."""
        return await self.receipts.consume(command_id)

    async def pending_commands(self) -> tuple[QueuedCommand, ...]:
        """Re-read the job and return its pending steer/follow_up commands in order, each with
        its payload (the job's state keeps references; the payloads are read from the
        commands' receipts)."""
        job = await self.receipts.own_job()
        if job is not None:
            self.job = job
        return await self.receipts.own_commands(self.job.pending_commands)


Handler = Callable[[HandlerContext], Coroutine[Any, Any, Any]]


def objective_of(ctx: HandlerContext) -> str:
    """The objective the job acts on (`payload.objectiveId`); the handler fails without one."""
    value = ctx.payload.get("objectiveId")
    if not isinstance(value, str):
        raise HandlerError("payload.objectiveId is required", retryable=False)
    return value


def no_handler_message(agent_id: str) -> str:
    """The spec's error for an agent id without a registered handler."""
    return f"No handler for agent '{agent_id}'"


def unsupported_kind_message(agent_id: str, kind: str) -> str:
    """The error for a kind an agent does not run (yet)."""
    return f"agent '{agent_id}' does not run kind '{kind}'"


def kinds_handler(agent_id: str, runs: Mapping[str, Handler]) -> Handler:
    """Return a handler for `agent_id` that dispatches on the payload kind it runs."""

    async def handle(ctx: HandlerContext) -> Any:
        handler = runs.get(ctx.job.kind)
        if handler is None:
            raise HandlerError(unsupported_kind_message(agent_id, ctx.job.kind), retryable=False)
        return await handler(ctx)

    return handle
