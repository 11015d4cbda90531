"""Factory handlers: objectives created (or planned), reconciled, watched, monitored, audited,
and their tasks and steps run in the objective's workspace."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import shlex
from typing import Any

from activities import workspaces
from activities.handlers.codex import run_task
from activities.handlers.context import HandlerContext, HandlerError, objective_of
from activities.handlers.steering import StdinFeed
from activities.sandbox import SandboxRefused, run_sandboxed
from receipts.errors import InvalidInput
from receipts.executables import first_refused, objective_commands
from receipts.objectives import audit as objective_audit_summary
from receipts.objectives import control
from receipts.objectives import metrics as factory_metrics
from receipts.objectives import store as objectives
from receipts.objectives import watchdog as objective_watchdog_rules
from receipts.objectives.graph import ObjectiveSpec, parse_objective, parse_tasks
from receipts.objectives.model import ObjectiveState
from receipts.objectives.watchdog import REASONS
from receipts.store import Draft

log = logging.getLogger("activities.handlers.factory")

PLANNER_ENV = "RECEIPT_FACTORY_PLANNER_COMMAND"
CODEX_COMMAND_ENV = "RECEIPT_CODEX_COMMAND"
PLANNER_OUTPUT_CHARS = 1_000_000  # a graph bigger than this is no graph to run


def _auth(ctx: HandlerContext) -> dict[str, Any]:
    auth = ctx.payload.get("authContext")
    return dict(auth) if isinstance(auth, dict) else {}


# --- factory.run / factory.dispatch -----------------------------------------------------------


async def _planner(ctx: HandlerContext, spec: ObjectiveSpec) -> Any:
    """Run RECEIPT_FACTORY_PLANNER_COMMAND in the command sandbox, in the objective's workspace,
    with `{title, goal}` on stdin; return the JSON it prints (its whole output, or the last line
    that is JSON: the sandbox merges stdout and stderr)."""
    factory_settings = ctx.settings.factory
    command = factory_settings.planner_command.strip()
    if not command:
        raise HandlerError(
            "the objective has no tasks and no planner is configured "
            f"(set {PLANNER_ENV} to a command that prints a task graph)",
            retryable=False,
        )
    timeout_ms = factory_settings.planner_timeout_ms
    request = json.dumps({"title": spec.title, "goal": spec.goal}).encode() + b"\n"
    output: list[str] = []

    async def collect(text: str) -> None:
        if sum(map(len, output)) < PLANNER_OUTPUT_CHARS:
            output.append(text)

    try:
        settings = ctx.settings.sandbox
        workspace = workspaces.objective_workspace(
            ctx.job.organization_id, objective_of(ctx), settings
        )
        async with asyncio.timeout(timeout_ms / 1000):
            ended = await run_sandboxed(
                shlex.split(command),
                workspace=workspace,
                network=ctx.job.agent_id in settings.egress_agents,
                on_output=collect,
                aborted=ctx.aborted,
                settings=settings,
                feed_stdin=StdinFeed(ctx, request, steers=False).feed,
            )
    except TimeoutError:
        raise HandlerError(f"the planner ran past {timeout_ms} ms", retryable=True) from None
    except (SandboxRefused, ValueError) as exc:
        raise HandlerError(f"could not start the planner {command!r}: {exc}") from exc
    text = "".join(output)
    if ended.aborted:
        raise HandlerError("aborted", retryable=False)
    if ended.exit_code != 0:
        raise HandlerError(
            f"the planner exited with status {ended.exit_code}: {text[-2000:]}", retryable=False
        )
    return _json_of(text)


def _json_of(text: str) -> Any:
    """The planner's JSON: its whole output, else its last line that parses."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    for line in reversed(text.splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    raise HandlerError(f"the planner did not print JSON: {text[-500:]!r}", retryable=False)


async def _planned(ctx: HandlerContext, spec: ObjectiveSpec) -> ObjectiveSpec:
    """The spec with the planner's tasks (and validate/publish when the spec has none)."""
    planned = await _planner(ctx, spec)
    raw: dict[str, Any] = {"title": spec.title, "goal": spec.goal}
    if isinstance(planned, list):
        raw["tasks"] = planned
    elif isinstance(planned, dict):
        raw.update({k: v for k, v in planned.items() if k in ("tasks", "validate", "publish")})
    else:
        raw["tasks"] = planned
    if "tasks" not in raw:
        raise HandlerError("the planner's graph has no 'tasks'", retryable=False)
    allowed = ctx.settings.factory.org_executables.get(ctx.job.organization_id or "")
    refused = first_refused(allowed, objective_commands(raw, "planner"))
    if refused is not None:
        # The planner read the tenant's goal: a task it writes is held to the organization's
        # list as a task the request names would be.
        field, message = refused
        factory_metrics.FACTORY_PLANS_REFUSED.inc()
        log.warning(
            "the planner wrote a command off the organization's allow-list: %s",
            message,
            extra={
                "event": "factory.planner_refused",
                "field": field,
                "objectiveId": ctx.payload.get("objectiveId"),
            },
        )
        raise HandlerError(f"the planner's graph is refused: {message}", retryable=False)
    try:
        graph = parse_objective(raw, "planner")
    except InvalidInput as exc:
        raise HandlerError(
            f"the planner's graph is invalid: {exc.message}", retryable=False
        ) from exc
    return dataclasses.replace(
        spec,
        tasks=graph.tasks,
        validate=spec.validate or graph.validate,
        publish=spec.publish or graph.publish,
    )


async def factory_run(ctx: HandlerContext) -> dict[str, Any]:
    """Create the objective (planning its tasks when it has none) and request its first control
    pass. A graph that cannot run fails the job non-retryably and writes no objective."""
    try:
        spec = parse_objective(ctx.payload.get("objective"), "payload.objective")
    except InvalidInput as exc:
        raise HandlerError(exc.message, retryable=False) from exc
    objective_id = objective_of(ctx)
    planned = spec.tasks is None
    if planned:
        spec = await _planned(ctx, spec)
    assert spec.tasks is not None
    organization_id = ctx.job.organization_id or ""
    created: dict[str, Any] = {
        "objectiveId": objective_id,
        "organizationId": organization_id,
        "authContext": _auth(ctx),
        "title": spec.title,
        "goal": spec.goal,
        "planned": planned,
        "runJobId": ctx.job.job_id,
        "tasks": [t.to_json() for t in spec.tasks],
        "validate": spec.validate.to_json() if spec.validate else None,
        "publish": spec.publish.to_json() if spec.publish else None,
    }
    if ctx.job.traceparent:
        # The run job's trace (its caller's): the objective's every job joins it.
        created["traceparent"] = ctx.job.traceparent
    outcome = ""  # stays empty: decide is not asked about another organization's objective

    def decide(state: ObjectiveState | None) -> list[Draft]:
        nonlocal outcome
        if state is not None:
            outcome = "existing"
            return []
        outcome = "created"
        return [
            Draft("objective.created", created),
            objectives.control_request("created", jobId=ctx.job.job_id),
        ]

    await ctx.receipts.update_objective(objective_id, decide, deliver_control=True)
    if not outcome:
        raise HandlerError(f"objectiveId {objective_id!r} is already in use", retryable=False)
    log.info(
        "objective created" if outcome == "created" else "objective already exists",
        extra={
            "event": "factory.objective_created",
            "objectiveId": objective_id,
            "tasks": len(spec.tasks),
            "planned": planned,
            "outcome": outcome,
        },
    )
    return {"objectiveId": objective_id, "outcome": outcome, "tasks": len(spec.tasks)}


async def factory_dispatch(ctx: HandlerContext) -> dict[str, Any]:
    """Add a phase of tasks to a live objective: its earlier phases' pending tasks are canceled
    (running ones finish), and control is requested."""
    objective_id = objective_of(ctx)
    phase = 0

    def decide(state: ObjectiveState | None) -> list[Draft]:
        nonlocal phase
        if state is None:
            raise HandlerError(f"no objective {objective_id!r}", retryable=False)
        if state.terminal:
            raise HandlerError(f"objective {objective_id!r} is {state.status}", retryable=False)
        taken = {t.task_id: t.phase for t in state.tasks}
        try:
            tasks = parse_tasks(ctx.payload.get("tasks"), "payload.tasks", taken)
        except InvalidInput as exc:
            raise HandlerError(exc.message, retryable=False) from exc
        phase = state.phase + 1
        return [
            Draft(
                "objective.phase_added",
                {
                    "phase": phase,
                    "tasks": [t.to_json() for t in tasks],
                    "reason": ctx.payload.get("reason"),
                    "jobId": ctx.job.job_id,
                    # A validate or publish that failed (recorded, the objective not yet
                    # settled) covered the earlier phases only: it runs again after this one.
                    "failedStepsAgain": True,
                },
            ),
            objectives.control_request("phase_added", jobId=ctx.job.job_id),
        ]

    try:
        added = await ctx.receipts.update_objective(objective_id, decide, deliver_control=True)
    except HandlerError:
        # A delivery of this job that committed its phase and died before settling the job:
        # this one is refused a second phase (its task ids are taken, or the objective settled
        # since); the job did its work, and says which phase it added.
        landed = await ctx.receipts.phase_added_by(objective_id, ctx.job.job_id)
        if landed is None:
            raise
        log.info(
            "phase already added by an earlier delivery of this job",
            extra={"event": "factory.phase_existing", "objectiveId": objective_id, "phase": landed},
        )
        return {"objectiveId": objective_id, "phase": landed, "outcome": "existing"}
    if not added:
        raise HandlerError(f"no objective {objective_id!r}", retryable=False)
    factory_metrics.FACTORY_PHASES_ADDED.inc()
    log.info(
        "phase added",
        extra={"event": "factory.phase_added", "objectiveId": objective_id, "phase": phase},
    )
    return {"objectiveId": objective_id, "phase": phase, "outcome": "added"}


# --- control, watchdog, audit -----------------------------------------------------------------


async def objective_control(ctx: HandlerContext) -> dict[str, Any]:
    """Reconcile the objective until a pass finds nothing to do; steers that arrived meanwhile
    (coalesced control requests) are consumed, and answered by the passes they asked for."""
    objective_id = objective_of(ctx)
    total = control.ReconcileResult()
    while True:
        result = await ctx.receipts.reconcile(objective_id, ctx.job.kind, ctx.settings.org_caps)
        total.passes += result.passes
        total.dispatched += result.dispatched
        total.held = result.held
        total.recorded += result.recorded
        total.aborted += result.aborted
        total.steps += result.steps
        total.settled = result.settled or total.settled
        pending = await ctx.pending_commands()
        for command in pending:
            await ctx.consume(command.command_id)
        state = await ctx.receipts.objective(objective_id)
        if state is None or state.terminal or not state.needs_reconcile:
            break
        if ctx.aborted.is_set() or total.passes >= control.MAX_PASSES:
            break
    return {"objectiveId": objective_id, **total.to_json()}


async def objective_watchdog(ctx: HandlerContext) -> dict[str, Any]:
    """Scan up to the scan limit of active objectives within the timeout; request control with
    reason `reconcile` for each that fires one of the three reasons. The result lists which
    objective fired which reason."""
    settings = ctx.settings.watchdog
    thresholds = objective_watchdog_rules.Thresholds(
        active_stale_ms=ctx.settings.timing.active_stale_ms
    )
    counts = dict.fromkeys(REASONS, 0)
    fired: list[dict[str, str]] = []
    scanned = 0
    timed_out = False
    try:
        async with asyncio.timeout(settings.timeout_ms / 1000):
            tick = objective_watchdog_rules.tick_of(ctx.job.job_id)
            states, now = await ctx.receipts.active_objectives(settings.scan_limit, tick)
            job_ids = [job_id for s in states for job_id in s.active_job_ids()]
            jobs = await ctx.receipts.jobs(job_ids)
            controlled = await ctx.receipts.objectives_under_control(states)
            for state in states:
                scanned += 1
                assert now is not None
                why = objective_watchdog_rules.reason(
                    state, jobs, state.objective_id in controlled, now, thresholds
                )
                if why is None:
                    continue
                requested = await ctx.receipts.request_control(
                    state.objective_id, "reconcile", watchdog=why
                )
                if not requested:  # gone meanwhile: nothing was written, nothing fired
                    continue
                counts[why] += 1
                factory_metrics.FACTORY_WATCHDOG_FIRED.labels(why).inc()
                fired.append({"objectiveId": state.objective_id, "reason": why})
                log.info(
                    "watchdog requested a reconcile",
                    extra={
                        "event": "factory.watchdog_fired",
                        "objectiveId": state.objective_id,
                        "reason": why,
                    },
                )
    except TimeoutError:
        timed_out = True
        factory_metrics.FACTORY_WATCHDOG_TIMEOUTS.inc()
        log.warning(
            "watchdog scan ran out of time",
            extra={"event": "factory.watchdog_timeout", "scanned": scanned},
        )
    return {
        "scanned": scanned,
        "limit": settings.scan_limit,
        "reconciled": fired,
        "reasons": counts,
        "timedOut": timed_out,
    }


async def objective_audit(ctx: HandlerContext) -> dict[str, Any]:
    """Append `objective.audited`: tasks, tries, durations, failures and the job behind each."""
    objective_id = objective_of(ctx)
    state = await ctx.receipts.objective(objective_id)
    if state is None:
        raise HandlerError(f"no objective {objective_id!r}", retryable=False)
    if not state.terminal:
        # Its one audit is of the settled objective: one written earlier (an audit job posted
        # or retried by hand) would take its place and the settled one would never be written.
        factory_metrics.FACTORY_AUDITS_REFUSED.inc()
        log.warning(
            "audit job refused: its objective is not settled",
            extra={
                "event": "factory.audit_refused",
                "objectiveId": objective_id,
                "status": state.status,
            },
        )
        raise HandlerError(
            f"objective {objective_id!r} is {state.status}: it is audited once settled",
            retryable=False,
        )
    jobs = await ctx.receipts.jobs(objective_audit_summary.jobs_to_read(state))
    summary = objective_audit_summary.summary(state, jobs)

    def decide(current: ObjectiveState | None) -> list[Draft]:
        if current is None or current.audit is not None or not current.terminal:
            return []
        return [Draft("objective.audited", {"summary": summary, "jobId": ctx.job.job_id})]

    if await ctx.receipts.update_objective(objective_id, decide):
        factory_metrics.FACTORY_AUDITS_WRITTEN.inc()
        log.info(
            "objective audited",
            extra={"event": "factory.objective_audited", "objectiveId": objective_id},
        )
    return {"objectiveId": objective_id, "totals": summary["totals"]}


# --- tasks and steps in the objective's workspace ---------------------------------------------


async def _run_in_workspace(ctx: HandlerContext, task: dict[str, Any]) -> dict[str, Any]:
    # The codex runner confines the command to the objective's workspace in its organization's
    # tree (activities/workspaces.py), shared by its tasks, validate and publish.
    payload = {**ctx.payload, "task": task}
    return await run_task(
        dataclasses.replace(ctx, job=ctx.job.model_copy(update={"payload": payload}))
    )


async def run_objective_task(ctx: HandlerContext) -> dict[str, Any]:
    """Run one try of a task in the objective's workspace: its command, or for a prompt
    RECEIPT_CODEX_COMMAND with the prompt on stdin (unset: the task fails, saying so)."""
    task_input = ctx.payload.get("input")
    if task_input is None and "task" in ctx.payload:
        return await run_task(ctx)  # a task job posted directly: `task: {command, cwd?}`
    if not isinstance(task_input, dict):
        raise HandlerError("payload.input must be {command: [argv]} or {prompt}", retryable=False)
    if "prompt" in task_input:
        command = ctx.settings.factory.codex_command.strip()
        if not command:
            raise HandlerError(
                f"task {ctx.payload.get('taskId')!r} carries a prompt but {CODEX_COMMAND_ENV} "
                "is not set (a coding-agent CLI that reads the prompt on stdin)",
                retryable=False,
            )
        return await _run_in_workspace(
            ctx,
            {"command": shlex.split(command), "stdin": str(task_input["prompt"])},
        )
    return await _run_in_workspace(ctx, {"command": task_input.get("command")})


async def run_integration_step(ctx: HandlerContext) -> dict[str, Any]:
    """Run the objective's validate or publish command in its workspace."""
    task_input = ctx.payload.get("input")
    if not isinstance(task_input, dict):
        raise HandlerError("payload.input must be {command: [argv]}", retryable=False)
    return await _run_in_workspace(ctx, {"command": task_input.get("command")})
