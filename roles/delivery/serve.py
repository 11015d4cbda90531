"""What the delivery roles run in their process: the recovery loops (every role), an attempt
worker (worker-chat, worker-codex, worker-control) and the driver with its dispatchers."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from temporalio.service import RPCError

from activities import sandbox, sandbox_etc
from activities.gateway import Gateway
from activities.gateway_budget import FLUSH_MS, Meter
from activities.handlers.registry import default_handlers
from activities.handlers.sdk import Installed
from activities.schedules import ScheduleActivities
from activities.watchdog_tick import WatchdogActivities
from activities.workspace_sweep import SWEEP_INTERVAL_MS, WorkspaceSweeper
from receipts.durations import parse_duration
from receipts.kinds import QUEUE_CODEX
from receipts.schedules.firing import Caps
from receipts.waits import within
from roles.delivery.agent_jobs import AgentJobDispatcher
from roles.delivery.dispatcher import Dispatcher
from roles.delivery.loops import (
    ObjectiveControlOutboxRedrive,
    ObjectiveResume,
    QueuedRedrive,
    Ticker,
    objective_control_outbox,
    wake_on_control_requests,
)
from roles.delivery.retention import RetentionLoop
from roles.delivery.runtime import attempt_worker, driver_worker
from roles.delivery.schedules import SYNC_INTERVAL_MS, ScheduleSync
from roles.delivery.starter import DriverStarter
from roles.delivery.watchdog_schedule import keep_watchdog_schedule
from roles.delivery.webhooks import WebhookDeliverer
from roles.infra.process import (
    GATEWAY_CLOSE_S,
    LAST_FLUSH_S,
    Runtime,
    run_until,
    until_stopped,
)
from roles.infra.temporal import ensure_search_attributes
from workflows.schedule_fire import ScheduleFireWorkflow
from workflows.watchdog_tick import WatchdogTickWorkflow

log = logging.getLogger("roles.delivery.serve")


def _meter_budgets(runtime: Runtime, gateway: Gateway) -> None:
    """With daily token budgets configured, meter the organizations' calls and flush the
    counts to the database every FLUSH_MS (a failed flush is logged and counted by the loop)."""
    budgets = runtime.settings.gateway.budgets
    if not budgets.any:
        return
    gateway.meter = Meter(runtime.store, budgets)
    flush = Ticker("gateway-usage-flush", gateway.meter.flush, FLUSH_MS, FLUSH_MS)
    runtime.spawn(flush.run(), flush.name)


async def stop_gateway(gateway: Gateway) -> None:
    """Once the worker drained (no turn calls its model any more): close the gateway's turn
    sockets, then write its meter's last counts, each bounded (`GATEWAY_CLOSE_S`,
    `LAST_FLUSH_S`: `stop_bound_s` counts them). A grant an abandoned handler still holds, its
    model call waited for, or a database away at shutdown held the exit past the pod's grace."""
    open_calls = sum(grant.in_flight for grant in gateway.grants.values())
    open_grants = len(gateway.grants)
    try:
        await within(gateway.close(), GATEWAY_CLOSE_S)
    except TimeoutError:
        log.warning(
            "the gateway's turn sockets still serving model calls are cut",
            extra={"event": "gateway.close_cut", "grants": open_grants, "inFlight": open_calls,
                   "waitedS": GATEWAY_CLOSE_S},
        )  # fmt: skip
    if gateway.meter is not None:
        await _last_flush(gateway.meter)


async def _last_flush(meter: Meter) -> None:
    """The counts of the calls since the last flush, as the role stops (within LAST_FLUSH_S:
    those not written then are dropped, and logged)."""
    try:
        await within(meter.flush(), LAST_FLUSH_S)
    except Exception as exc:  # the role stops all the same
        organizations, calls, tokens = meter.unwritten()
        log.warning(
            "the last token counts of the gateway could not be written; they are dropped",
            extra={
                "event": "gateway.usage_flush_failed",
                "error": str(exc) or f"no answer within {LAST_FLUSH_S:g} s",
                "organizations": organizations,
                "calls": calls,
                "tokens": tokens,
            },
        )


def _starter(runtime: Runtime, *, beside_driver_worker: bool = False) -> DriverStarter:
    """The starter of this process; `beside_driver_worker` when the process also runs the
    driver worker on the same client: its starts may then plan the first run and be eager."""
    assert runtime.client is not None
    return DriverStarter(
        runtime.client,
        runtime.store,
        runtime.settings.core,
        runtime.settings.timing,
        plan_first_run=beside_driver_worker,
        eager_start=beside_driver_worker,
    )


def start_loops(
    runtime: Runtime,
    *,
    maintenance: bool,
    post_callbacks: bool,
    stop: asyncio.Event | None = None,
) -> QueuedRedrive:
    """Start the queued redrive and the startup objective resume; with `maintenance`, also the
    objective-control outbox redrive and, with RECEIPT_RETENTION, retention. Without
    `post_callbacks` the redrive leaves lost callbacks to the roles that post them; with it,
    the redrive claims no owed callback once `stop` is set, and the role awaits its `drain`.
    Returns the redrive."""
    http = runtime.http if post_callbacks else None
    loops = runtime.settings.loops
    redrive = QueuedRedrive(
        runtime.store, _starter(runtime), runtime.settings.core, loops, http=http, stop=stop
    )
    runtime.spawn(redrive.run(), redrive.name)
    resume = ObjectiveResume(runtime.store)
    runtime.spawn(resume.run(loops.startup_settle_ms), resume.name)
    if not maintenance:
        return redrive
    core = runtime.settings.core
    pruner = RetentionLoop.from_settings(
        runtime.store, core.retention, loops, callback_urls=core.callback_urls
    )
    if pruner is not None:
        runtime.spawn(
            Ticker(pruner.name, pruner.run_once, pruner.interval_ms).run(),
            pruner.name,
        )
    outbox = ObjectiveControlOutboxRedrive.of(objective_control_outbox(runtime.store), loops)
    wake = asyncio.Event()
    runtime.spawn(wake_on_control_requests(runtime.listener, wake), "outbox-wake")
    runtime.spawn(
        Ticker(outbox.name, outbox.run_once, outbox.interval_ms, wake=wake).run(),
        outbox.name,
    )
    return redrive


async def run_attempt_worker(
    runtime: Runtime,
    queue: str,
    stop: asyncio.Event,
    *,
    watchdog: bool,
    sandboxed: bool,
    installed: Installed,
) -> None:
    """Run the attempt worker of `queue` until `stop`, then drain it. With `watchdog` it also
    keeps the watchdog Schedule and runs its tick, and keeps the organizations' schedules in
    Temporal and runs their firings; with `sandboxed` (its jobs run commands) it
    first logs how the sandbox confines them, serves the AI gateway its agent turns call models
    through (activities/gateway.py), and at its clean stop removes its /etc views.

    It runs the built-in handlers and the `installed` ones, and lists them; while an installed
    handler failed to load it takes no attempts at all (it is not ready either), so the jobs of
    that agent wait for a worker that loaded it instead of failing `No handler`."""
    assert runtime.client is not None
    handlers = {**default_handlers(), **installed.handlers}
    log.info(
        "handlers: %s",
        ", ".join(handlers),
        extra={"event": "handlers.loaded", "installed": dict(installed.loaded)},
    )
    if installed.failures:
        log.error(
            "installed handlers failed to load; taking no attempts: %s",
            "; ".join(installed.failures),
            extra={"event": "handlers.load_failed", "failures": list(installed.failures)},
        )
        await stop.wait()
        return
    workflows: list[type] = []
    activities: list[Callable[..., Awaitable[Any]]] = []
    if watchdog:
        workflows.append(WatchdogTickWorkflow)
        activities.append(WatchdogActivities(runtime.store).enqueue_watchdog)
        # The organizations' schedules: their firings, and the sync that keeps a Temporal
        # Schedule per schedule (roles/delivery/schedules.py).
        workflows.append(ScheduleFireWorkflow)
        # A firing is held to the api's limits on a direct enqueue (the same variables).
        api = runtime.settings.api
        caps = Caps(
            api.org_max_queued,
            api.org_max_active,
            max_timeout_ms=api.max_timeout_ms,
            executables=api.org_executables,
            max_commands=api.max_commands_per_job,
            max_command_bytes=api.max_command_bytes,
            gateway_urls=tuple(api.gateway_url_allowlist),
        )
        activities.append(ScheduleActivities(runtime.store, caps).fire_schedule)
        sync = ScheduleSync(
            runtime.client,
            runtime.store,
            runtime.settings.core,
            runtime.settings.loops.schedule_check_interval_ms / 1000,
        )
        runtime.spawn(Ticker(sync.name, sync.run_once, SYNC_INTERVAL_MS).run(), sync.name)
        # Tried again until Temporal takes it (a refusal logged and counted each time).
        keeper = keep_watchdog_schedule(
            runtime.client, runtime.settings.core, runtime.settings.watchdog
        )
        runtime.spawn(keeper, "watchdog_schedule")
    gateway = None
    if sandboxed:
        await sandbox.announce(runtime.settings.sandbox)
        gateway = Gateway(runtime.settings.providers, runtime.http)
        _meter_budgets(runtime, gateway)
        _sweep_workspaces(runtime)
    process = runtime.settings.process
    worker = attempt_worker(
        runtime.client,
        runtime.store,
        runtime.settings.core.queue(queue),
        handlers,
        settings=runtime.settings.handlers,
        role=runtime.role,
        listener=runtime.listener,
        concurrency=process.concurrency(runtime.role),
        graceful_shutdown=process.grace,
        workflows=workflows,
        activities=activities,
        gateway=gateway,
    )
    await run_until(worker.run, worker.shutdown, stop, process.grace)
    if gateway is not None:
        await stop_gateway(gateway)  # drained: no turn calls its model any more
    if sandboxed:
        sandbox_etc.remove_views()  # drained: no command has a view as its /etc any more


def _sweep_workspaces(runtime: Runtime) -> None:
    """With RECEIPT_WORKSPACE_RETENTION, remove the workspaces idle past it whose owners are no
    longer active (activities/workspace_sweep.py)."""
    settings = runtime.settings.sandbox
    retention = parse_duration(settings.workspace_retention, name="RECEIPT_WORKSPACE_RETENTION")
    if retention is None:
        return
    sweeper = WorkspaceSweeper(runtime.store, settings, retention)
    # The first pass at a random point of the interval: pods sharing one volume, started
    # together by a rollout, do not all sweep at once.
    first = random.randrange(SWEEP_INTERVAL_MS)
    runtime.spawn(
        Ticker(sweeper.name, sweeper.run_once, SWEEP_INTERVAL_MS, first).run(), sweeper.name
    )


async def run_driver(
    runtime: Runtime, stop: asyncio.Event, redrive: QueuedRedrive | None = None
) -> None:
    """Run the driver worker until `stop`, with the dispatcher (which may plan first runs) and
    the agent-job dispatcher beside it; its drain waits for `redrive`'s owed callback posts in
    flight too (`start_loops`).

    The dispatcher stops with `stop`, as the worker begins to drain: a start of its own then
    went through the task queue (a stopping worker takes no eager task), where a poll the
    stopping worker still had open could be handed the job's first workflow task and never run
    it (Temporal SDK 1.35), and the job waited out the workflow task timeout (10 s). The other
    drivers' dispatchers hear the same notices and start those jobs eagerly into their own
    workers; with no other driver, the next one's start-up rescan starts them."""
    assert runtime.client is not None
    try:
        await ensure_search_attributes(runtime.client, runtime.client.namespace)
    except RPCError as exc:
        log.warning(
            "could not register the Receipt search attributes; register them once by hand "
            "(README, 'Temporal UI')",
            extra={"event": "temporal.search_attributes_failed", "error": str(exc)},
        )
    dispatcher = Dispatcher(
        runtime.store, runtime.listener, _starter(runtime, beside_driver_worker=True)
    )
    runtime.spawn(until_stopped(dispatcher.run(), stop), "dispatcher")
    agent_jobs = AgentJobDispatcher(
        runtime.store,
        runtime.listener,
        settings=runtime.settings.agent_jobs,
        callbacks=runtime.settings.core,
        http=runtime.http,
        org_cap=runtime.settings.core.org_running_cap(QUEUE_CODEX),
    )
    # At `stop` it, the webhook deliverer and the redrive's callback recovery claim no more;
    # their posts in flight (wakeups, webhooks, owed callbacks) get the grace, as the worker's
    # do, within the worker's bounded shutdown.
    grace = runtime.settings.process.grace
    waking = runtime.spawn(agent_jobs.run(stop, grace.total_seconds()), "agent-jobs")
    # Per-organization webhooks, posted beside the global callbacks (roles/delivery/webhooks.py).
    webhooks = WebhookDeliverer(runtime.store, runtime.settings.webhooks, runtime.http)
    posting = runtime.spawn(webhooks.run(stop, grace.total_seconds()), webhooks.name)
    worker = driver_worker(
        runtime.client,
        runtime.store,
        runtime.settings.core,
        runtime.settings.timing,
        http=runtime.http,
        graceful_shutdown=grace,
    )

    async def shutdown() -> None:
        """The worker's drain and the posts' beside it, all within its bound."""
        owed = redrive.drain(grace.total_seconds()) if redrive is not None else asyncio.sleep(0)
        await asyncio.gather(worker.shutdown(), asyncio.wait({waking, posting}), owed)

    await run_until(worker.run, shutdown, stop, grace)
