"""Role processes: api, driver, worker-chat, worker-codex, worker-control, and `all`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio.client import Client

from activities.handlers import default_handlers
from receipts.kinds import QUEUE_CHAT, QUEUE_CODEX, QUEUE_CONTROL
from receipts.listen import Listener
from receipts.settings import Settings
from receipts.store import Store
from receipts.timing import TimingSettings
from roles import logs
from roles.db import migrate_url, open_store, resolve_url
from roles.dispatcher import Dispatcher
from roles.runtime import attempt_worker, driver_worker
from roles.starter import DriverStarter
from roles.temporal import DEFAULT_ADDRESS, connect

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
DEFAULT_GRACE_MS = 30_000


def resolve_role(value: str | None) -> tuple[str, bool]:
    """Return `(role, recognised)`. Anything but the five roles or `all` resolves to `all`."""
    name = (value or "").strip()
    if name in ROLES or name == ALL:
        return name, True
    return ALL, False


def execute_concurrency(role: str, env: dict[str, str] | None = None) -> int:
    """The role's concurrent attempts: its default, or RECEIPT_RESONATE_EXECUTE_CONCURRENCY."""
    env = env if env is not None else dict(os.environ)
    override = env.get("RECEIPT_RESONATE_EXECUTE_CONCURRENCY", "").strip()
    if override:
        value = int(override)
        if value < 1:
            raise ValueError("RECEIPT_RESONATE_EXECUTE_CONCURRENCY must be a positive integer")
        return value
    return DEFAULT_CONCURRENCY.get(role, 8)


def shutdown_grace() -> timedelta:
    """Grace for running handlers at SIGTERM (RECEIPT_SHUTDOWN_GRACE_MS, default 30 000)."""
    return timedelta(
        milliseconds=int(os.environ.get("RECEIPT_SHUTDOWN_GRACE_MS", DEFAULT_GRACE_MS))
    )


@dataclass
class Runtime:
    """What a role process holds; closed in reverse order at shutdown."""

    settings: Settings
    timing: TimingSettings
    store: Store
    db_url: str
    listener: Listener
    client: Client | None = None


async def _open(settings: Settings) -> Runtime:
    url = resolve_url(settings)
    await migrate_url(url)
    store = await open_store(url, settings)
    return Runtime(settings, TimingSettings.from_env(), store, url, Listener(url))


async def run_role(requested: str | None, stop: asyncio.Event) -> None:
    """Run one role until `stop` is set."""
    role, recognised = resolve_role(requested)
    logs.configure(role)
    if not recognised:
        log.warning(
            "RECEIPT_PROCESS_ROLE %r is not a role; running as 'all' (maintenance loops only, "
            "no workflows or activities). Accepted roles: %s",
            requested,
            ", ".join(ROLES),
            extra={"event": "role.unrecognised", "value": requested, "accepted": list(ROLES)},
        )
    if role == "api":
        from roles.api import serve_api

        await serve_api(stop)
        return
    settings = Settings()
    runtime = await _open(settings)
    tasks: list[asyncio.Task[None]] = [asyncio.create_task(runtime.listener.run())]
    try:
        address = settings.temporal_address or DEFAULT_ADDRESS
        if role in (*WORKER_QUEUES, "driver"):
            runtime.client = await connect(address, settings.temporal_namespace)
        log.info("role starting", extra={"event": "role.start", "pid": os.getpid()})
        if role in WORKER_QUEUES:
            await _run_worker(role, runtime, stop)
        elif role == "driver":
            await _run_driver(runtime, stop, tasks)
        else:
            await stop.wait()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await runtime.store.close()
        log.info("role stopped", extra={"event": "role.stop"})


async def _run_worker(role: str, runtime: Runtime, stop: asyncio.Event) -> None:
    assert runtime.client is not None
    worker = attempt_worker(
        runtime.client,
        runtime.store,
        runtime.settings.queue(WORKER_QUEUES[role]),
        default_handlers(),
        role=role,
        listener=runtime.listener,
        concurrency=execute_concurrency(role),
        graceful_shutdown=shutdown_grace(),
    )
    await _run_until(worker.run, worker.shutdown, stop)


async def _run_driver(
    runtime: Runtime, stop: asyncio.Event, tasks: list[asyncio.Task[None]]
) -> None:
    assert runtime.client is not None
    starter = DriverStarter(runtime.client, runtime.store, runtime.settings, runtime.timing)
    dispatcher = Dispatcher(runtime.store, runtime.listener, starter)
    tasks.append(asyncio.create_task(dispatcher.run()))
    worker = driver_worker(runtime.client, runtime.store, runtime.settings, runtime.timing)
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
            "shutting down: no new work; running handlers get the grace period",
            extra={"event": "role.draining"},
        )
        await shutdown()
    stopping.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running


def main(requested: str | None = None) -> None:
    """Process entry point: run the role named by the argument or RECEIPT_PROCESS_ROLE."""
    requested = requested if requested is not None else os.environ.get("RECEIPT_PROCESS_ROLE")

    async def _main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_role(requested, stop)

    asyncio.run(_main())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
