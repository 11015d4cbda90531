"""A role process's plumbing: what it holds (store, listener, Temporal client, its tasks),
the start-up heap freeze, the drain at SIGTERM, the event loop and a clean exit."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import httpx
import psycopg
from psycopg_pool import PoolTimeout
from temporalio.client import Client

from receipts import metrics
from receipts.errors import TransientStorageError
from receipts.listen import Listener
from receipts.store import Store
from receipts.waits import within
from roles.infra.db import migrate_url, named, open_store, resolve_url
from roles.infra.loopwatch import LoopWatch
from roles.infra.settings import RuntimeSettings
from roles.infra.temporal import connect_client
from roles.infra.tracing import flush_spans

log = logging.getLogger("roles.infra.process")

# Generation-0 threshold once started. The default (700) runs a collection every few requests
# and a full one every ~100 000 allocations; together with the frozen start-up heap this took
# the api's p99 at 16 clients from ~90 ms to ~33 ms in `make bench`.
GC_THRESHOLDS = (50_000, 20, 100)

# What a worker's shutdown may take beyond the handlers' grace: the cancelled attempts' ends (a
# handler gets activities/attempt.py `HANDLER_CANCEL_S`, then its release is written) and the
# pollers'. A pod's termination grace must exceed the grace, this margin, `CLOSE_S` and
# `TASKS_END_S` and `SPANS_FLUSH_S`, and worker-codex's `GATEWAY_STOP_S` (55 s against the
# default 30 s grace, 60 s for worker-codex: deploy/README.md).
SHUTDOWN_MARGIN = timedelta(seconds=10)
EXIT_SHUTDOWN_STUCK = 1
# What closing the runtime may take (its tasks, the bookkeeping writer's last flush, the pool),
# and what the tasks still running after the role's main returned get once cancelled (a handler
# an attempt left behind swallows its cancellation): neither keeps the process from exiting.
CLOSE_S = 5.0
TASKS_END_S = 2.0
# The exit's flush of the spans not yet exported (an OTLP collector that does not answer).
SPANS_FLUSH_S = 5.0
# What a role's exit takes at most once its drain ended: the close, its tasks' end, the flush.
EXIT_S = CLOSE_S + TASKS_END_S + SPANS_FLUSH_S
# What worker-codex's AI gateway gets once the worker drained (roles/delivery/serve.py): the
# close of its turns' sockets (a turn an abandoned handler still runs, its model call cut), then
# the last write of its token meter (a database away at shutdown); what either leaves is logged.
GATEWAY_CLOSE_S = 1.0
LAST_FLUSH_S = 2.0
GATEWAY_STOP_S = GATEWAY_CLOSE_S + LAST_FLUSH_S
# The exit status of a second Ctrl-C (SIGINT) during the drain: out at once, as SIGINT's.
EXIT_FORCED = 130
# How long a role's start waits for a database that refuses it (down, out of connections),
# trying again after 0.5 s, doubling to 5 s; past it, the role exits (and is restarted).
DB_START_PATIENCE_S = 60.0
DB_START_FIRST_WAIT_S, DB_START_MAX_WAIT_S = 0.5, 5.0
# The signals that drain a role, and how often their handlers are looked at (`DrainSignals`).
DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT)
SIGNAL_CHECK_S = 1.0


@dataclass
class Runtime:
    """What a role process holds; closed in reverse order at shutdown."""

    role: str
    settings: RuntimeSettings
    store: Store
    db_url: str
    listener: Listener
    http: httpx.AsyncClient
    client: Client | None = None
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    watch: LoopWatch | None = None

    def spawn(self, work: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run `work` beside the role until the role stops (returned, for a role that waits for
        it to drain). One that ends with an error before (each loop outlives its passes'
        failures: this is a bug's) is logged and counted, never dropped unseen: what it did is
        not done again until the process restarts."""
        task = asyncio.create_task(work, name=name)
        task.add_done_callback(_task_ended)
        self.tasks.append(task)
        return task

    async def close(self) -> None:
        """Cancel the role's tasks, then close its HTTP client and its store."""
        if self.watch is not None:
            self.watch.stop()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.http.aclose()
        await self.store.close()

    async def close_within(self, seconds: float = CLOSE_S) -> None:
        """`close`, given up after `seconds` (logged `role.close_stuck`): a database that stops
        answering must not hold the process past its pod's grace."""
        try:
            await within(self.close(), seconds)
        except TimeoutError:
            log.error(
                f"closing the role's tasks and store took over {seconds:g} s; exiting without",
                extra={"event": "role.close_stuck", "waitedS": seconds},
            )


def _task_ended(task: asyncio.Task[Any]) -> None:
    if task.cancelled() or (exc := task.exception()) is None:
        return
    metrics.ROLE_TASKS_FAILED.labels(task.get_name()).inc()
    log.error(
        "a background task of the role ended with an error; it does not run again until the "
        "process restarts",
        exc_info=exc,
        extra={"event": "role.task_failed", "task": task.get_name(), "error": str(exc)},
    )


async def open_runtime(role: str, settings: RuntimeSettings, *, lazy_client: bool) -> Runtime:
    """Migrate the database and open what `role` holds: its pool (the api's own size for the
    api), its listener (running) and a Temporal client whose SDK metrics the role's
    own `/metrics` serves. `lazy_client` connects to Temporal at the first call."""
    url = named(resolve_url(settings.core), role)
    # The migrations' transaction and the LISTEN session past a transaction pooler, if any.
    direct = named(settings.core.database_direct_url or url, role)
    await patiently(lambda: migrate_url(direct), "migrate")
    listener = Listener(direct)  # tries again at once when the pool reconnects (a database back)
    pooled = settings.core.database_direct_url is not None
    store = await patiently(
        lambda: open_store(
            url, settings.core, api=role == "api", on_connect=listener.nudge, pooled=pooled
        ),
        "pool",
    )
    runtime = Runtime(role, settings, store, url, listener, httpx.AsyncClient())
    runtime.watch = LoopWatch.start(settings.process.loop_stall_ms)
    try:
        runtime.client = await connect_client(
            settings.core, settings.temporal_tls, lazy=lazy_client
        )
    except BaseException:
        await runtime.close()
        raise
    runtime.spawn(runtime.listener.run(), "listener")
    return runtime


T = TypeVar("T")


async def patiently(
    start: Callable[[], Awaitable[T]], what: str, patience_s: float = DB_START_PATIENCE_S
) -> T:
    """`start()`, tried again while the database refuses it (down, failing over, out of
    connections) for up to `patience_s`, each refusal logged `role.database_waiting`: a role
    that starts a moment before its database is ready waits instead of exiting at once."""
    loop = asyncio.get_running_loop()
    ends = loop.time() + patience_s
    delay = DB_START_FIRST_WAIT_S
    while True:
        try:
            return await start()
        # A connection lost mid-migration (a restart, a failover) is the store's
        # `TransientStorageError`: waited out as a refused connect is.
        except (psycopg.OperationalError, PoolTimeout, TransientStorageError) as exc:
            if loop.time() + delay > ends:
                raise
            log.warning(
                "the database refused the role's start (%s); trying again in %.1f s",
                what,
                delay,
                extra={"event": "role.database_waiting", "step": what, "error": str(exc)},
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, DB_START_MAX_WAIT_S)


def freeze_startup_heap() -> None:
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


def stop_bound_s(grace_s: float) -> float:
    """The longest a worker role (or the driver) takes from SIGTERM to its exit: its drain,
    bounded at the grace and `SHUTDOWN_MARGIN`, then worker-codex's AI gateway's stop
    (`GATEWAY_STOP_S`; the other roles have none), then its exit (`EXIT_S`). A supervisor that
    SIGKILLs it sooner may cut a release as it is written (`receipt up`, a pod's
    `terminationGracePeriodSeconds`: 55 s at the default 30 s grace)."""
    return grace_s + SHUTDOWN_MARGIN.total_seconds() + GATEWAY_STOP_S + EXIT_S


class ShutdownStuck(RuntimeError):
    """A worker's shutdown did not end within the grace and `SHUTDOWN_MARGIN`."""


async def run_until(
    run: Callable[[], Coroutine[Any, Any, None]],
    shutdown: Callable[[], Awaitable[None]],
    stop: asyncio.Event,
    grace: timedelta,
) -> None:
    """Run a worker's `run` until it ends or `stop` is set; then `shutdown` drains it: no new
    work, running handlers get RECEIPT_SHUTDOWN_GRACE_MS. A shutdown still going
    `SHUTDOWN_MARGIN` after the grace raises `ShutdownStuck` (logged `role.shutdown_stuck`):
    the process then exits without it, as a SIGKILL would end it, and what it held is
    delivered again from the receipts."""
    running = asyncio.create_task(run())
    stopping = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if stopping in done:
        log.info(
            "shutting down: taking no new work; running handlers get the grace period",
            extra={"event": "role.draining", "graceS": grace.total_seconds()},
        )
        bound = (grace + SHUTDOWN_MARGIN).total_seconds()
        try:
            await within(shutdown(), bound)
        except TimeoutError:
            log.error(
                f"the worker's shutdown did not end within {bound:g} s (the grace and "
                f"{SHUTDOWN_MARGIN.total_seconds():g} s); exiting without it",
                extra={"event": "role.shutdown_stuck", "waitedS": bound},
            )
            raise ShutdownStuck(f"shutdown still running after {bound:g} s") from None
    stopping.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running


async def until_stopped(work: Coroutine[Any, Any, None], stop: asyncio.Event) -> None:
    """Run `work` until it ends or `stop` is set, then cancel it (what it had under way too).
    An error it ends with is raised (a role task's: logged `role.task_failed`)."""
    running = asyncio.create_task(work)
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        running.cancel()
    await asyncio.wait({running})
    if not running.cancelled():
        running.result()


class DrainSignals:
    """SIGTERM and SIGINT set the role's `stop` (its drain), whatever a handler does to them.

    A handler that installs its own (`signal.signal`, its loop's `add_signal_handler`; a library
    that traps SIGTERM to clean up, or ignores it) took the drain's place: at a rollout's SIGTERM
    the worker took new work on and was killed at the pod's grace, its attempts cut off. They
    are installed with `signal.signal`, so either replacement shows in `signal.getsignal`, and
    looked at every `SIGNAL_CHECK_S`: one replaced is put back (logged
    `role.signal_handler_restored`, counted in `receipt_signal_handlers_restored_total`)."""

    def __init__(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        interrupted = False  # a SIGINT came: the loop may not have run its `stop.set` yet

        def stopping(signum: int, frame: Any) -> None:
            # On the main thread, between two bytecodes: the loop runs the rest. A SIGINT once
            # the drain began, or once a SIGINT asked for it (a second Ctrl-C), exits here, at
            # once (`_forced_exit`): a loop held by a blocking call (the stalled drain a second
            # Ctrl-C is pressed at) ran a callback only once that call returned.
            nonlocal interrupted
            if signum == signal.SIGINT:
                if interrupted or stop.is_set():
                    _forced_exit()
                interrupted = True
            loop.call_soon_threadsafe(stop.set)

        self._stopping = stopping

    def install(self) -> None:
        for sig in DRAIN_SIGNALS:
            signal.signal(sig, self._stopping)

    def restore(self) -> None:
        """Put back each drain signal's handler that something replaced."""
        for sig in DRAIN_SIGNALS:
            current = signal.getsignal(sig)
            if current is self._stopping:
                continue
            signal.signal(sig, self._stopping)
            metrics.SIGNAL_HANDLERS_RESTORED.labels(sig.name).inc()
            log.warning(
                "%s's handler was replaced (a handler's signal.signal or add_signal_handler); "
                "the drain's is put back",
                sig.name,
                extra={
                    "event": "role.signal_handler_restored",
                    "signal": sig.name,
                    "replacedBy": repr(current)[:200],
                },
            )

    async def guard(self, interval_s: float | None = None) -> None:
        """`restore` every `interval_s` (`SIGNAL_CHECK_S`) until cancelled."""
        for sig in DRAIN_SIGNALS:
            metrics.SIGNAL_HANDLERS_RESTORED.labels(sig.name)  # from 0, for an alert's increase
        while True:
            await asyncio.sleep(SIGNAL_CHECK_S if interval_s is None else interval_s)
            self.restore()


def run_until_signalled(
    main: Callable[[asyncio.Event], Coroutine[Any, Any, None]], loop: str
) -> None:
    """Run `main(stop)` on `loop` (`uvloop` or `asyncio`), SIGTERM and SIGINT setting `stop`
    (`DrainSignals`); then exit 0 without interpreter finalization. A SIGINT once `stop` is set
    (a second Ctrl-C, as uvicorn's "CTRL+C to force quit" asks) exits at once, `EXIT_FORCED`."""

    async def signalled() -> None:
        stop = asyncio.Event()
        signals = DrainSignals(stop)
        signals.install()
        guard = asyncio.create_task(signals.guard(), name="drain-signals")
        # The exits are taken here, not through the loop's own end, which would wait without
        # a bound on every task still pending (a stuck shutdown, a handler left behind).
        try:
            await main(stop)
        except ShutdownStuck:
            _exit_without_finalizing(EXIT_SHUTDOWN_STUCK)
        guard.cancel()
        await end_tasks(TASKS_END_S)
        _exit_without_finalizing()

    run_event_loop(signalled(), loop)


def _forced_exit() -> None:
    """A second SIGINT: the process exits now, without its drain (what it held is delivered
    again from the receipts, as after a SIGKILL). Run in the signal handler, between two
    bytecodes of whatever the main thread was doing (a log line's write, perhaps): whatever
    the line or the flush raise there, the process exits."""
    try:
        log.warning(
            "a second Ctrl-C (SIGINT) during the drain: exiting now, without it; what the role "
            "held is delivered again from the receipts",
            extra={"event": "role.forced_exit"},
        )
        _exit_without_finalizing(EXIT_FORCED, spans_s=0.0)
    finally:
        os._exit(EXIT_FORCED)


async def end_tasks(seconds: float) -> None:
    """Cancel every other task of the loop and wait for them at most `seconds`; the ones
    still running are named (logged `role.tasks_left`) and left to the exit."""
    current = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not current]
    for task in tasks:
        task.cancel()
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=seconds)
    if pending:
        log.warning(
            "tasks still running at exit are left behind",
            extra={"event": "role.tasks_left", "tasks": sorted(t.get_name() for t in pending)},
        )


def _exit_without_finalizing(code: int = 0, spans_s: float = SPANS_FLUSH_S) -> None:
    """Exit with `code` (0: a clean stop) without running interpreter finalization.

    Everything the role owns is closed by now, but the Temporal SDK's Rust threads can still
    call into a finalizing interpreter and abort the process (`PyGILState_Release`, exit -6),
    seen here once after a clean SIGTERM drain. Logs and the spans not yet exported (for at
    most `spans_s`; none for a forced exit) are flushed first (`os._exit` runs no atexit hook,
    so the exporter's own flush never would).
    """
    if spans_s > 0:
        flush_spans(spans_s)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _pidfd_works() -> bool:
    """Whether this kernel lets us open a pidfd (Linux 5.3+, not blocked by seccomp), tested
    as CPython 3.12 tests it, on our own pid."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


class ResolvingLoop(asyncio.SelectorEventLoop):
    """asyncio's loop, its name lookups (`getaddrinfo`: psycopg's connections, the listener's
    reconnect, httpx's requests) on threads of their own (uvloop makes them on libuv's).

    asyncio's own makes them on its default executor, which is the handlers' (`asyncio.to_thread`,
    as the README advises): a cancelled handler's thread runs on, and with every thread of it
    held (at most 32) the worker could open no connection, for good."""

    async def getaddrinfo(
        self,
        host: Any,
        port: Any,
        *,
        family: int = 0,
        type: int = 0,
        proto: int = 0,
        flags: int = 0,
    ) -> Any:
        lookup = functools.partial(socket.getaddrinfo, host, port, family, type, proto, flags)
        return await self.run_in_executor(_RESOLVER, lookup)

    async def getnameinfo(self, sockaddr: Any, flags: int = 0) -> Any:
        return await self.run_in_executor(_RESOLVER, socket.getnameinfo, sockaddr, flags)


# A lookup may wait out the resolver's timeouts (seconds): a few at once, never the handlers'.
_RESOLVER = ThreadPoolExecutor(max_workers=4, thread_name_prefix="receipt-resolve")


def _resolving_loop() -> asyncio.AbstractEventLoop:
    loop = ResolvingLoop()
    asyncio.set_event_loop(loop)  # as `asyncio.run` does (the child watcher attaches to it)
    return loop


def run_event_loop(main: Coroutine[Any, Any, None], loop: str) -> None:
    """Run `main` on uvloop (the api served ~20 % more requests at a lower p99 in `make bench`)
    or on asyncio's own loop (`ResolvingLoop`)."""
    if loop == "asyncio":
        if sys.version_info < (3, 12) and _pidfd_works():
            # Python 3.11 waits for each child in a thread of its own; a pidfd needs none
            # (3.12 does this by itself, and deprecates choosing).
            asyncio.get_event_loop_policy().set_child_watcher(asyncio.PidfdChildWatcher())
        with asyncio.Runner(loop_factory=_resolving_loop) as runner:
            runner.run(main)
        return
    import uvloop

    uvloop.run(main)
