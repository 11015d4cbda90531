"""The role switch: which process runs what (`python -m roles.role NAME`, `receipt role NAME`;
`receipt api` is the api role).

- api: the HTTP API (roles/api/app.py).
- driver: the driver worker, the dispatcher and the agent-job dispatcher.
- worker-chat, worker-codex, worker-control: the attempt worker of their task queue; codex jobs
  run commands in the sandbox; worker-control also keeps the watchdog Schedule and runs its tick.
- all: no worker. Any other name resolves to it, with a warning.

Every role runs the queued redrive and the startup objective resume; worker-control and `all`
also run the objective-control outbox redrive, retention (with RECEIPT_RETENTION) and the
queue-depth gauges. Every role but the api (which answers them itself) serves /metrics,
/healthz and /readyz on its own port. The wiring lives in roles/delivery/serve.py (workers,
loops) and roles/infra/ (the process).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from activities.handlers.sdk import HandlerConflict, Installed, load_installed
from receipts.kinds import QUEUE_CHAT, QUEUE_CODEX, QUEUE_CONTROL, QUEUE_DRIVER
from roles.delivery.serve import run_attempt_worker, run_driver, start_loops
from roles.infra import logs
from roles.infra.health import serve_health, serve_role_health
from roles.infra.metrics import run_queue_depth
from roles.infra.process import freeze_startup_heap, open_runtime, run_until_signalled
from roles.infra.settings import CALLBACK_ROLES, ProcessSettings, RuntimeSettings, load_or_exit
from roles.infra.tracing import configure_tracing

log = logging.getLogger("roles.role")

ROLES: tuple[str, ...] = ("api", "driver", "worker-chat", "worker-codex", "worker-control")
ALL = "all"
WORKER_QUEUES = {
    "worker-chat": QUEUE_CHAT,
    "worker-codex": QUEUE_CODEX,
    "worker-control": QUEUE_CONTROL,
}
# The maintenance roles: the outbox redrive, retention and the queue-depth gauges (the same
# number in every process, so one role exports it).
MAINTENANCE_ROLES = ("worker-control", ALL)
# Roles whose jobs run commands. They stay on asyncio's loop: CPython spawns with vfork(),
# libuv (uvloop) with fork(), which in a worker's large process tripled a `true` job's settle
# time in `make bench` (started→settled 4 → 13 ms).
SPAWNING_ROLES = ("worker-codex",)


def resolve_role(value: str | None) -> tuple[str, bool]:
    """Return `(role, recognised)`. Anything but the five roles or `all` resolves to `all`."""
    name = (value or "").strip()
    return (name, True) if name in ROLES or name == ALL else (ALL, False)


def event_loop_for(role: str, settings: ProcessSettings) -> str:
    """`uvloop` or `asyncio`: `RECEIPT_EVENT_LOOP` when set, else by role."""
    return settings.event_loop or ("asyncio" if role in SPAWNING_ROLES else "uvloop")


async def run_role(requested: str | None, settings: RuntimeSettings, stop: asyncio.Event) -> None:
    """Run one role until `stop` is set: its workers, its loops, its metrics endpoint."""
    role, recognised = resolve_role(requested)
    logs.configure(
        role,
        settings.process.log_format,
        level=logging.getLevelName(settings.process.log_level.upper()),
    )
    configure_tracing(f"receipt-{role}", otlp=settings.process.otlp_endpoint is not None)
    if not recognised:
        log.warning(
            "RECEIPT_PROCESS_ROLE %r is not a role; running as 'all' (maintenance loops only, "
            "no workflows or activities). Accepted roles: %s",
            requested,
            ", ".join(ROLES),
            extra={"event": "role.unrecognised", "value": requested, "accepted": list(ROLES)},
        )
    # api and all only need Temporal for redrives: they start (and serve) without it.
    installed = _installed_or_exit() if role in WORKER_QUEUES else Installed({}, {}, ())
    runtime = await open_runtime(role, settings, lazy_client=role in ("api", ALL))
    try:
        if role == "api" and settings.process.metrics_port is not None:
            serve_health(settings.process.metrics_host, settings.process.metrics_port, None)
        if role != "api":
            queues = [WORKER_QUEUES[role]] if role in WORKER_QUEUES else []
            queues += [QUEUE_DRIVER] if role == "driver" else []
            serve_role_health(
                runtime,
                queues,
                stop,
                sandboxed=role in SPAWNING_ROLES,
                handler_failures=installed.failures,
            )
        if role in MAINTENANCE_ROLES:
            runtime.spawn(run_queue_depth(runtime.store, settings.core), "queue-depth")
        maintenance, callbacks = role in MAINTENANCE_ROLES, role in CALLBACK_ROLES
        redrive = start_loops(runtime, maintenance=maintenance, post_callbacks=callbacks, stop=stop)
        if role == "api":
            from roles.api.app import serve_api  # imported before the heap is frozen
        freeze_startup_heap()
        log.info("role starting", extra={"event": "role.start", "pid": os.getpid()})
        if role in WORKER_QUEUES:
            control, sandboxed = role == "worker-control", role in SPAWNING_ROLES
            await run_attempt_worker(
                runtime,
                WORKER_QUEUES[role],
                stop,
                watchdog=control,
                sandboxed=sandboxed,
                installed=installed,
            )
        elif role == "driver":
            await run_driver(runtime, stop, redrive)
        elif role == "api":
            await serve_api(stop, settings, store=runtime.store, listener=runtime.listener)
        else:
            await stop.wait()
            # The owed callback posts in flight get the grace (`all` posts them, as the driver).
            await redrive.drain(settings.process.grace.total_seconds())
    finally:
        await runtime.close_within()
        log.info("role stopped", extra={"event": "role.stop"})


def _installed_or_exit() -> Installed:
    """The handlers installed as entry points; on two handlers of one agent id, the conflict
    printed and exit 2 (a load failure only makes the worker unready: `run_attempt_worker`)."""
    try:
        return load_installed()
    except HandlerConflict as exc:
        print(f"receipt: handler conflict: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _api_tokens_or_exit(settings: RuntimeSettings) -> None:
    """The api's tokens, read and checked before anything starts (a malformed entry, or no
    token on a non-loopback bind): on a bad one, one line and exit 2, as any bad setting."""
    from roles.api.auth import TokenConfigError, check_open_bind, load_tokens

    try:
        check_open_bind(
            load_tokens(settings.api.tokens_file, settings.api.tokens), settings.api.host
        )
    except TokenConfigError as exc:
        print(f"receipt: bad configuration: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def main(requested: str | None = None, settings: RuntimeSettings | None = None) -> None:
    """Process entry point: run the role named by the argument or RECEIPT_PROCESS_ROLE, with
    `settings`, else the settings read (and checked) once, here."""
    settings = settings or load_or_exit()
    requested = requested if requested is not None else settings.process.role
    role = resolve_role(requested)[0]
    if role == "api":
        _api_tokens_or_exit(settings)
    run_until_signalled(
        lambda stop: run_role(requested, settings, stop), event_loop_for(role, settings.process)
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
