"""`receipt up`: the whole stack on one machine, every role a separate process, Ctrl-C stops all."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Iterable
from pathlib import Path

from activities.gateway_providers import key_variables
from receipts.settings import SettingsError
from roles.api.auth import LOCAL_TOKEN_FILE, ensure_local_admin_token
from roles.api.settings import GRACEFUL_SHUTDOWN_S
from roles.infra.db import direct_url, migrate_url, resolve_url
from roles.infra.ports import wait_port
from roles.infra.process import EXIT_FORCED, EXIT_S, stop_bound_s
from roles.infra.settings import (
    CALLBACK_ROLES,
    DEFAULT_METRICS_PORTS,
    ProcessSettings,
    RuntimeSettings,
)
from roles.infra.supervisor import Supervised, say
from roles.infra.temporal import temporal_argv
from roles.role import ROLES

TEMPORAL_PORT, TEMPORAL_UI_PORT = 7233, 8233
# The examples of a checkout: what `receipt up` starts with when nothing else is configured.
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
USERNS_SYSCTL = Path("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
# What `up` gives a role past its own shutdown's bound before SIGKILL: the process's own end.
KILL_SLACK_S = 3.0
TEMPORAL_STOP_S = 10.0

# Secrets of the environment and the roles that use them; every other process starts without
# them (worker-codex runs tenants' commands: it gets no API token and no callback secret; only
# the driver posts callbacks: CALLBACK_ROLES).
ROLE_SECRETS: dict[str, tuple[str, ...]] = {
    "RECEIPT_API_TOKENS": ("api",),
    "RECEIPT_API_TOKENS_FILE": ("api",),
    "RECEIPT_API_TOKEN": (),  # the CLI's own token: no role uses it
    "RECEIPT_CALLBACK_TOKEN": CALLBACK_ROLES,
    "RECEIPT_CALLBACK_SIGNING_SECRET": CALLBACK_ROLES,
}


def role_env(role: str, env: dict[str, str], keys: Iterable[str] = ()) -> dict[str, str]:
    """`env` without the secrets `role` does not use (`temporal`: without any RECEIPT_ setting
    either). `keys`: the variables the providers file reads its model keys from, which only
    worker-codex's gateway uses (`key_variables`)."""
    secrets = {**ROLE_SECRETS, **dict.fromkeys(keys, ("worker-codex",))}
    if role == "temporal":
        return {k: v for k, v in env.items() if not k.startswith("RECEIPT_") and k not in secrets}
    return {k: v for k, v in env.items() if role in secrets.get(k, (role,))}


def metrics_ports(process: ProcessSettings) -> str:
    """The roles' own /metrics ports, as the start-up lines name them: the api serves its
    /metrics on its API port (a port of its own only with RECEIPT_METRICS_PORT), and with
    RECEIPT_METRICS_PORT set every role takes that port (0: any free one)."""
    roles = [r for r in DEFAULT_METRICS_PORTS if r in ROLES and r != "api"]
    if process.metrics_port is not None:
        port = process.metrics_port or "any free port"
        return f"{', '.join(roles)} and api on RECEIPT_METRICS_PORT ({port})"
    return ", ".join(f"{r} :{DEFAULT_METRICS_PORTS[r]}" for r in roles)


def kill_after_s(settings: RuntimeSettings) -> float:
    """How long `up` waits for the roles it sent SIGTERM before it SIGKILLs them: the longest
    a role's own shutdown takes (a worker's: the grace, 10 s for a drain still running,
    worker-codex's 3 s for its AI gateway's stop, its exit's 12 s; the api's: its drain delay,
    its requests' 10 s, the same exit), and `KILL_SLACK_S`: 58 s at the default 30 s grace
    (deploy/k8s gives worker-codex's pod 60 s, the others 55 s). Sooner, a
    handler that swallows its cancellation (abandoned 5 s after the grace) was killed as its
    job's release was being written."""
    worker = stop_bound_s(settings.process.shutdown_grace_ms / 1000)
    api = settings.api.drain_delay_ms / 1000 + GRACEFUL_SHUTDOWN_S + EXIT_S
    return max(worker, api) + KILL_SLACK_S


async def _temporal(
    data_dir: Path, env: dict[str, str], keys: frozenset[str], colour: bool
) -> Supervised:
    argv = temporal_argv(data_dir / "temporal.sqlite", TEMPORAL_PORT, TEMPORAL_UI_PORT)
    server = Supervised("temporal", argv, role_env("temporal", env, keys), colour)
    server.start()
    await wait_port(TEMPORAL_PORT, exited=server.returncode, name="the Temporal dev server")
    return server


def example_defaults(env: dict[str, str], examples: Path = EXAMPLES) -> list[str]:
    """Fill in, where `env` sets none, the example agents registry, planner and coding agent of
    the checkout (`examples/`), and let the command sandbox read that directory. Returns what it
    set, for the start-up lines (nothing outside a checkout)."""
    if not (examples / "agents.yaml").is_file():
        return []
    defaults = {
        "RECEIPT_AGENTS_FILE": str(examples / "agents.yaml"),
        "RECEIPT_FACTORY_PLANNER_COMMAND": f"python3 {examples / 'planner.py'}",
        "RECEIPT_CODEX_COMMAND": f"python3 {examples / 'coding_agent.py'}",
    }
    chosen = [name for name, value in defaults.items() if not env.get(name)]
    for name in chosen:
        env[name] = defaults[name]
    if chosen:
        binds = [b for b in env.get("RECEIPT_SANDBOX_RO_BINDS", "").split(":") if b]
        if str(examples) not in binds:
            env["RECEIPT_SANDBOX_RO_BINDS"] = ":".join([*binds, str(examples)])
    return chosen


def userns_advice(sysctl: Path = USERNS_SYSCTL) -> str:
    """What to do when bubblewrap cannot create namespaces: the fix for hosts whose AppArmor
    restricts unprivileged user namespaces (Ubuntu 24.04+, Debian 13), else the general one."""
    try:
        restricted = sysctl.read_text().strip() == "1"
    except OSError:
        restricted = False
    if restricted:
        return (
            "this host's AppArmor restricts unprivileged user namespaces "
            f"({sysctl} is 1): allow them with "
            "`sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (or an AppArmor "
            "profile that gives bwrap the userns permission), then restart; codex jobs fail "
            "until then"
        )
    return (
        "allow unprivileged user namespaces (or run as root), or set "
        "RECEIPT_CODEX_SANDBOX=none to run commands unconfined (trusted work only); codex jobs "
        "fail until then"
    )


async def _check_sandbox(env: dict[str, str], colour: bool) -> None:
    """Say at once, with the fix, when commands could not run in the sandbox here."""
    from activities.sandbox import SandboxSettings, probe

    try:
        ok, message = await probe(SandboxSettings.load(env))
    except SettingsError as exc:
        ok, message = False, str(exc)
    if not ok:
        say("up", f"WARNING: the command sandbox cannot run here: {message}", colour)
        say("up", f"WARNING: {userns_advice()}", colour)


async def up(settings: RuntimeSettings) -> int:
    """Start everything and wait for Ctrl-C (or SIGTERM); return the exit status (130 after a
    second Ctrl-C forced the stop). The roles' environment is the one `settings` were read
    from, with what `up` sets."""
    core = settings.core
    colour = sys.stdout.isatty()
    data_dir = core.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    stopping, forced = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    loop.add_signal_handler(signal.SIGINT, _interrupted, stopping, forced, colour)

    url = resolve_url(core)
    applied = await migrate_url(direct_url(core))  # around a transaction pooler, if one is set
    say(
        "up",
        f"database ready ({'embedded' if not core.database_url else 'configured'}); "
        f"migrations applied: {applied or 'none needed'}",
        colour,
    )
    temporal: Supervised | None = None
    address = core.temporal_address
    env = dict(settings.environment)
    keys = key_variables(settings.gateway.providers_file)
    if not address:
        temporal = await _temporal(data_dir, env, keys, colour)
        address = f"127.0.0.1:{TEMPORAL_PORT}"
    env.update(
        RECEIPT_DATABASE_URL=url,
        RECEIPT_TEMPORAL_ADDRESS=address,
        RECEIPT_LOG_FORMAT="human" if colour else env.get("RECEIPT_LOG_FORMAT", "json"),
        PYTHONUNBUFFERED="1",
    )
    examples = example_defaults(env)
    await _check_sandbox(env, colour)
    local_token = None
    if not env.get("RECEIPT_API_TOKENS") and not env.get("RECEIPT_API_TOKENS_FILE"):
        # Never open: a random admin token under the data directory instead.
        local_token, tokens_file = ensure_local_admin_token(data_dir)
        env["RECEIPT_API_TOKENS_FILE"] = str(tokens_file.resolve())
    roles = [
        Supervised(
            role, [sys.executable, "-m", "roles.role", role], role_env(role, env, keys), colour
        )
        for role in ROLES
    ]
    keepers = [asyncio.create_task(r.keep_alive(stopping)) for r in roles]
    host, port = settings.api.host, settings.api.port
    metrics = metrics_ports(settings.process)
    for line in (
        f"API          http://{host}:{port}   (docs: http://{host}:{port}/docs)",
        f"Console      http://{host}:{port}/console (sign in with the API token below)",
        f"Temporal UI  http://127.0.0.1:{TEMPORAL_UI_PORT}"
        if temporal
        else f"Temporal     {address}",
        f"Metrics      http://{host}:{port}/metrics (api, admin token); {metrics}",
        f"Data         {data_dir.resolve()}",
        *(
            [
                f"Examples     {', '.join(examples)} from {EXAMPLES} (the demo agent `demo`, "
                "a planner, a coding agent; README, 'Plug in a real coding agent')"
            ]
            if examples
            else []
        ),
        *(
            [
                f"API token    admin, in {(data_dir / LOCAL_TOKEN_FILE).resolve()}: "
                f"export RECEIPT_API_TOKEN=$(cat {data_dir / LOCAL_TOKEN_FILE}) for the CLI, "
                'or curl -H "Authorization: Bearer $RECEIPT_API_TOKEN" …'
            ]
            if local_token
            else []
        ),
        "Ctrl-C stops everything (a second Ctrl-C: at once).",
    ):
        say("up", line, colour)
    await stopping.wait()
    kill_after = kill_after_s(settings)
    say(
        "up",
        "stopping: roles first (they finish or release held jobs; SIGKILL after "
        f"{kill_after:g} s), then Temporal. Ctrl-C again to stop at once",
        colour,
    )
    await asyncio.gather(*(r.stop_async(kill_after, forced) for r in roles))
    for keeper in keepers:
        keeper.cancel()
    await asyncio.gather(*keepers, return_exceptions=True)
    if temporal is not None:
        await temporal.stop_async(TEMPORAL_STOP_S, forced)
    say("up", "stopped", colour)
    return EXIT_FORCED if forced.is_set() else 0


def _interrupted(stopping: asyncio.Event, forced: asyncio.Event, colour: bool) -> None:
    """Ctrl-C: stop (`stopping`), or, once stopping, SIGKILL what still runs (`forced`)."""
    if not stopping.is_set():
        stopping.set()
    elif not forced.is_set():
        forced.set()
        say(
            "up",
            "Ctrl-C again: SIGKILL to every process still running; the jobs they held are "
            "delivered again from the receipts",
            colour,
        )
