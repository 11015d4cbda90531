# Over 400 lines: the role switch and each role's wiring; thinning it (issue 10 item 5) is not done.
"""Role processes: api, driver, worker-chat, worker-codex, worker-control, and `all`."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx
from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.runtime import PrometheusConfig, TelemetryConfig
from temporalio.runtime import Runtime as TemporalRuntime
from temporalio.service import RPCError

from activities import sandbox
from activities.handlers import default_handlers
from activities.watchdog import WatchdogActivities
from receipts.kinds import QUEUE_CHAT, QUEUE_CODEX, QUEUE_CONTROL, QUEUE_DRIVER
from receipts.listen import Listener
from receipts.settings import Settings
from receipts.store import Store
from receipts.timing import TimingSettings
from receipts.watchdog import WatchdogSettings
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
from roles.delivery.starter import DriverStarter
from roles.delivery.watchdog import ensure_watchdog_schedule
from roles.infra import logs
from roles.infra.db import migrate_url, open_store, resolve_url
from roles.infra.health import HealthChecker, sandbox_reason, serve_health
from roles.infra.metrics import Metrics
from roles.infra.settings import LoopSettings, ProcessSettings, exit_on_bad_settings
from roles.infra.temporal import connect_config, ensure_search_attributes
from roles.infra.tracing import configure_tracing
from roles.infra.tracing import recording as tracing_recording
from workflows.watchdog import WatchdogTickWorkflow

log = logging.getLogger("roles.role")

ROLES: tuple[str, ...] = ("api", "driver", "worker-chat", "worker-codex", "worker-control")
ALL = "all"
WORKER_QUEUES = {
    "worker-chat": QUEUE_CHAT,
    "worker-codex": QUEUE_CODEX,
    "worker-control": QUEUE_CONTROL,
}
# How many attempts each worker role runs at once (RECEIPT_RESONATE_EXECUTE_CONCURRENCY overrides).
DEFAULT_CONCURRENCY = {"worker-chat": 16, "worker-codex": 4, "worker-control": 8}
DEFAULT_GRACE_MS: int = ProcessSettings.model_fields["shutdown_grace_ms"].default
# The queue-depth gauge is the same number in every process: one role exports it. worker-control
# is the maintenance role (the watchdog schedule, the outbox redrive, retention); the driver and
# api keep their pools for the path of a job.
QUEUE_DEPTH_ROLES = ("worker-control", "all")
DEFAULT_METRICS_PORTS = {
    ALL: 9470,
    "api": 9475,  # the API serves /metrics on its own port; this one is for the SDK's (+100)
    "driver": 9471,
    "worker-chat": 9472,
    "worker-codex": 9473,
    "worker-control": 9474,
}


def resolve_role(value: str | None) -> tuple[str, bool]:
    """Return `(role, recognised)`. Anything but the five roles or `all` resolves to `all`."""
    name = (value or "").strip()
    if name in ROLES or name == ALL:
        return name, True
    return ALL, False


def execute_concurrency(role: str, env: dict[str, str] | None = None) -> int:
    """The role's concurrent attempts: its default, or RECEIPT_RESONATE_EXECUTE_CONCURRENCY."""
    override = ProcessSettings.load(env).execute_concurrency
    return override if override is not None else DEFAULT_CONCURRENCY.get(role, 8)


def shutdown_grace() -> timedelta:
    """Grace for running handlers at SIGTERM (RECEIPT_SHUTDOWN_GRACE_MS, default 30 000)."""
    return timedelta(milliseconds=ProcessSettings.load().shutdown_grace_ms)


def metrics_port(role: str, env: dict[str, str] | None = None) -> int:
    """The role's /metrics port: RECEIPT_METRICS_PORT, else the role's default (0 = any free)."""
    port = ProcessSettings.load(env).metrics_port
    return port if port is not None else DEFAULT_METRICS_PORTS.get(role, 9470)


def metrics_host() -> str:
    """The address the /metrics endpoints bind (RECEIPT_METRICS_HOST, default 127.0.0.1)."""
    return ProcessSettings.load().metrics_host


@dataclass
class Runtime:
    """What a role process holds; closed in reverse order at shutdown."""

    role: str
    settings: Settings
    timing: TimingSettings
    store: Store
    db_url: str
    listener: Listener
    metrics: Metrics
    http: httpx.AsyncClient
    client: Client | None = None
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    def spawn(self, work: Coroutine[Any, Any, Any], name: str) -> None:
        self.tasks.append(asyncio.create_task(work, name=name))


async def _open(role: str, settings: Settings) -> Runtime:
    url = resolve_url(settings)
    await migrate_url(url)
    store = await open_store(url, settings, api=role == "api")
    metrics = Metrics()
    metrics.wire_process_counters()
    return Runtime(
        role,
        settings,
        TimingSettings.from_env(),
        store,
        url,
        Listener(url),
        metrics,
        httpx.AsyncClient(),
    )


async def _connect(runtime: Runtime) -> Client:
    """A Temporal client with the tracing interceptor and the SDK's Prometheus metrics."""
    settings = runtime.settings
    port = metrics_port(runtime.role)
    temporal_port = 0 if port == 0 else port + 100
    host = metrics_host()
    try:
        sdk_runtime: TemporalRuntime | None = TemporalRuntime(
            telemetry=TelemetryConfig(
                metrics=PrometheusConfig(bind_address=f"{host}:{temporal_port}")
            )
        )
    except Exception as exc:  # a taken port must not stop the role
        log.warning(
            "Temporal SDK metrics disabled: could not bind %s:%s",
            host,
            temporal_port,
            extra={"event": "metrics.sdk_unavailable", "error": str(exc)},
        )
        sdk_runtime = None
    client = await Client.connect(
        # Address, namespace, TLS/mTLS and API key (RECEIPT_TEMPORAL_*, or an envconfig profile).
        **connect_config(settings),
        # Spans cross Temporal only when they are recorded (roles/tracing.py): otherwise the
        # interceptor's per-call spans and headers are work nobody reads.
        interceptors=[TracingInterceptor()] if tracing_recording() else [],
        runtime=sdk_runtime,
        # api and all only need Temporal for redrives: they start (and serve) without it.
        lazy=runtime.role in ("api", ALL),
    )
    return client


async def run_role(requested: str | None, stop: asyncio.Event) -> None:
    """Run one role until `stop` is set: its workers, its loops, its metrics endpoint."""
    role, recognised = resolve_role(requested)
    logs.configure(role)
    configure_tracing(f"receipt-{role}")
    if not recognised:
        log.warning(
            "RECEIPT_PROCESS_ROLE %r is not a role; running as 'all' (maintenance loops only, "
            "no workflows or activities). Accepted roles: %s",
            requested,
            ", ".join(ROLES),
            extra={"event": "role.unrecognised", "value": requested, "accepted": list(ROLES)},
        )
    settings = Settings()
    runtime = await _open(role, settings)
    try:
        runtime.client = await _connect(runtime)
        if role != "api":
            _serve_health(runtime, stop)
        runtime.spawn(runtime.listener.run(), "listener")
        if role in QUEUE_DEPTH_ROLES:
            runtime.spawn(runtime.metrics.run_queue_depth(runtime.store), "queue-depth")
        _start_loops(runtime)
        if role == "api":
            import roles.api.app  # noqa: F401  (imported before the heap is frozen)
        _freeze_startup_heap()
        log.info("role starting", extra={"event": "role.start", "pid": os.getpid()})
        if role in WORKER_QUEUES:
            await _run_worker(role, runtime, stop)
        elif role == "driver":
            await _run_driver(runtime, stop)
        elif role == "api":
            from roles.api.app import serve_api

            await serve_api(
                stop, store=runtime.store, listener=runtime.listener, metrics=runtime.metrics
            )
        else:
            await stop.wait()
    finally:
        for task in runtime.tasks:
            task.cancel()
        await asyncio.gather(*runtime.tasks, return_exceptions=True)
        await runtime.http.aclose()
        await runtime.store.close()
        log.info("role stopped", extra={"event": "role.stop"})


# Generation-0 threshold once started. The default (700) runs a collection every few requests
# and a full one every ~100 000 allocations; together with the frozen start-up heap this took
# the api's p99 at 16 clients from ~90 ms to ~33 ms in `make bench`.
GC_THRESHOLDS = (50_000, 20, 100)


def _freeze_startup_heap() -> None:
    """Move everything allocated while starting (FastAPI, pydantic, temporalio, OpenTelemetry:
    a few hundred thousand objects that live as long as the process) out of the collector's
    sight, so a full collection walks only what requests and jobs allocate."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    log.debug(
        "start-up heap frozen",
        extra={"event": "role.heap_frozen", "frozen": gc.get_freeze_count()},
    )


def _serve_health(runtime: Runtime, stop: asyncio.Event) -> None:
    """Serve /metrics, /healthz and /readyz on the role's port (roles/infra/health.py): ready
    while the pool reaches PostgreSQL and Temporal sees this process poll its task queues."""
    queues = [runtime.settings.queue(q) for q in _polled_queues(runtime.role)]
    extra = [sandbox_reason] if runtime.role in SPAWNING_ROLES else []
    checker = HealthChecker(runtime.store, runtime.client, queues, stop, extra_checks=extra)
    serve_health(metrics_host(), metrics_port(runtime.role), checker.state)
    runtime.spawn(checker.run(), "health")


def _polled_queues(role: str) -> list[str]:
    """The task queues whose pollers readiness waits for (none for `all`)."""
    if role in WORKER_QUEUES:
        return [WORKER_QUEUES[role]]
    return [QUEUE_DRIVER] if role == "driver" else []


def _starter(runtime: Runtime, *, plan_first_run: bool = False) -> DriverStarter:
    assert runtime.client is not None
    return DriverStarter(
        runtime.client,
        runtime.store,
        runtime.settings,
        runtime.timing,
        runtime.metrics.starter_hooks(),
        plan_first_run=plan_first_run,
    )


def _start_loops(runtime: Runtime) -> None:
    """Every role runs the queued redrive and the startup objective resume; worker-control and
    `all` also run the objective-control outbox redrive and, with RECEIPT_RETENTION, retention."""
    hooks = runtime.metrics.loop_hooks()
    # Roles that run commands post no callbacks (the others recover them), so they need no
    # callback secrets: `receipt up` gives them none.
    http = None if runtime.role in SPAWNING_ROLES else runtime.http
    redrive = QueuedRedrive(
        runtime.store, _starter(runtime), runtime.settings, http=http, hooks=hooks
    )
    runtime.spawn(
        Ticker(
            redrive.name,
            redrive.run_once,
            redrive.config.interval_ms,
            redrive.config.startup_delay_ms,
            hooks,
        ).run(),
        redrive.name,
    )
    resume = ObjectiveResume(runtime.store, hooks=hooks)
    runtime.spawn(resume.run(LoopSettings.load().startup_settle_ms), resume.name)
    if runtime.role in ("worker-control", ALL):
        pruner = RetentionLoop.from_settings(
            runtime.store, runtime.settings.retention, runtime.metrics.retention_hooks()
        )
        if pruner is not None:
            runtime.spawn(
                Ticker(pruner.name, pruner.run_once, pruner.interval_ms, 0, hooks).run(),
                pruner.name,
            )
        outbox = ObjectiveControlOutboxRedrive.from_env(
            objective_control_outbox(runtime.store), hooks
        )
        wake = asyncio.Event()
        runtime.spawn(wake_on_control_requests(runtime.listener, wake), "outbox-wake")
        runtime.spawn(
            Ticker(outbox.name, outbox.run_once, outbox.interval_ms, 0, hooks, wake).run(),
            outbox.name,
        )


async def _run_worker(role: str, runtime: Runtime, stop: asyncio.Event) -> None:
    assert runtime.client is not None
    queue = runtime.settings.queue(WORKER_QUEUES[role])
    extra: dict[str, Any] = {}
    if role == "worker-control":
        watchdog = WatchdogActivities(runtime.store)
        extra = {
            "workflows": [WatchdogTickWorkflow],
            "activities": [watchdog.enqueue_watchdog],
        }
        try:
            await ensure_watchdog_schedule(
                runtime.client, runtime.settings, WatchdogSettings.from_env()
            )
        except RPCError as exc:
            log.error(
                "could not create or update the watchdog schedule",
                extra={"event": "watchdog.schedule_failed", "error": str(exc)},
            )
    if role in SPAWNING_ROLES:
        await sandbox.announce()
    worker = attempt_worker(
        runtime.client,
        runtime.store,
        queue,
        default_handlers(),
        role=role,
        listener=runtime.listener,
        concurrency=execute_concurrency(role),
        hooks=runtime.metrics.attempt_hooks(),
        graceful_shutdown=shutdown_grace(),
        **extra,
    )
    await _run_until(worker.run, worker.shutdown, stop)


async def _run_driver(runtime: Runtime, stop: asyncio.Event) -> None:
    assert runtime.client is not None
    try:
        await ensure_search_attributes(runtime.client, runtime.client.namespace)
    except RPCError as exc:
        log.warning(
            "could not register the Receipt search attributes; register them once by hand "
            "(README, 'Temporal UI')",
            extra={"event": "temporal.search_attributes_failed", "error": str(exc)},
        )
    # The dispatcher runs beside the driver worker: its reads may plan the first runs.
    dispatcher = Dispatcher(runtime.store, runtime.listener, _starter(runtime, plan_first_run=True))
    runtime.spawn(dispatcher.run(), "dispatcher")
    agent_jobs = AgentJobDispatcher(
        runtime.store, runtime.listener, callbacks=runtime.settings, http=runtime.http
    )
    runtime.spawn(agent_jobs.run(), "agent-jobs")
    worker = driver_worker(
        runtime.client, runtime.store, runtime.settings, runtime.timing, http=runtime.http
    )
    await _run_until(worker.run, worker.shutdown, stop)


async def _run_until(
    run: Callable[[], Coroutine[Any, Any, None]],
    shutdown: Callable[[], Awaitable[None]],
    stop: asyncio.Event,
) -> None:
    running = asyncio.create_task(run())
    stopping = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if stopping in done:
        log.info(
            "shutting down: taking no new work; running handlers get the grace period",
            extra={"event": "role.draining", "graceS": shutdown_grace().total_seconds()},
        )
        await shutdown()
    stopping.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running


def main(requested: str | None = None) -> None:
    """Process entry point: run the role named by the argument or RECEIPT_PROCESS_ROLE."""
    exit_on_bad_settings(api=False)  # every concern; the api's below, for the api role only
    requested = requested if requested is not None else ProcessSettings.load().role
    if resolve_role(requested)[0] == "api":
        exit_on_bad_settings()

    async def _main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_role(requested, stop)

    run_event_loop(_main(), event_loop_for(resolve_role(requested)[0]))
    _exit_without_finalizing()


def _exit_without_finalizing() -> None:
    """Exit 0 after a clean stop without running interpreter finalization.

    Everything the role owns is closed by now, but the Temporal SDK's Rust threads can still
    call into a finalizing interpreter and abort the process (`PyGILState_Release`, exit -6),
    seen here once after a clean SIGTERM drain. Logs are flushed first.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# Roles that spawn commands stay on asyncio's loop: CPython spawns with vfork(), libuv (uvloop)
# with fork(), which in a worker's large process tripled a `true` job's settle time in
# `make bench` (started→settled 4 → 13 ms).
SPAWNING_ROLES = ("worker-codex",)


def event_loop_for(role: str) -> str:
    """`uvloop` or `asyncio`: `RECEIPT_EVENT_LOOP` when set, else by role."""
    chosen = ProcessSettings.load().event_loop
    if chosen is not None:
        return chosen
    return "asyncio" if role in SPAWNING_ROLES else "uvloop"


def _pidfd_works() -> bool:
    """Whether this kernel lets us open a pidfd (Linux 5.3+, not blocked by seccomp), tested
    as CPython 3.12 tests it, on our own pid."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


def run_event_loop(main: Coroutine[Any, Any, None], loop: str) -> None:
    """Run `main` on uvloop (the api served ~20 % more requests at a lower p99 in `make bench`)
    or on asyncio's own loop."""
    if loop == "asyncio":
        if sys.version_info < (3, 12) and _pidfd_works():
            # Python 3.11 waits for each child in a thread of its own; a pidfd needs none
            # (3.12 does this by itself, and deprecates choosing).
            asyncio.get_event_loop_policy().set_child_watcher(asyncio.PidfdChildWatcher())
        asyncio.run(main)
        return
    import uvloop

    uvloop.run(main)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
