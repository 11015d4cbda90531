"""`receipt up`: the whole stack on one machine, every role a separate process, Ctrl-C stops all."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from receipts.settings import Settings
from roles.infra.db import migrate_url, resolve_url
from roles.infra.temporal import (
    dev_server_args,
    search_attribute_flags,
    sqlite_file_args,
    temporal_cli,
)
from roles.role import DEFAULT_METRICS_PORTS, ROLES

COLOURS = {
    "api": "\033[36m",
    "driver": "\033[35m",
    "worker-chat": "\033[32m",
    "worker-codex": "\033[33m",
    "worker-control": "\033[34m",
    "temporal": "\033[90m",
    "up": "\033[1m",
}
RESET = "\033[0m"
BACKOFF_START_S, BACKOFF_MAX_S = 1.0, 30.0
STABLE_AFTER_S = 60.0
TEMPORAL_PORT, TEMPORAL_UI_PORT = 7233, 8233

# Secrets of the environment and the roles that use them; every other process starts without
# them (worker-codex runs tenants' commands: it gets no API token and no callback secret).
CALLBACK_ROLES = ("api", "driver", "worker-chat", "worker-control")
ROLE_SECRETS: dict[str, tuple[str, ...]] = {
    "RECEIPT_API_TOKENS": ("api",),
    "RECEIPT_API_TOKENS_FILE": ("api",),
    "RECEIPT_API_TOKEN": (),  # the CLI's own token: no role uses it
    "RECEIPT_CALLBACK_TOKEN": CALLBACK_ROLES,
    "RECEIPT_CALLBACK_SIGNING_SECRET": CALLBACK_ROLES,
}


def role_env(role: str, env: dict[str, str]) -> dict[str, str]:
    """`env` without the secrets `role` does not use (`temporal`: without any RECEIPT_ setting)."""
    if role == "temporal":
        return {k: v for k, v in env.items() if not k.startswith("RECEIPT_")}
    return {k: v for k, v in env.items() if role in ROLE_SECRETS.get(k, (role,))}


def _say(name: str, line: str, colour: bool) -> None:
    prefix = f"{name:>14} | "
    if colour:
        prefix = f"{COLOURS.get(name, '')}{prefix}{RESET}"
    sys.stdout.write(prefix + line.rstrip("\n") + "\n")
    sys.stdout.flush()


async def _pump(
    name: str, stream: asyncio.StreamReader, colour: bool, log_file: Path | None
) -> None:
    if log_file is None:
        async for raw in stream:
            _say(name, raw.decode(errors="replace"), colour)
        return
    with log_file.open("ab") as out:
        async for raw in stream:
            out.write(raw)
            out.flush()


def _port_open(host: str, port: int) -> bool:
    with contextlib.closing(socket.socket()) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


@dataclass
class Supervised:
    """One role process kept alive with a restart backoff (1 s doubling to 30 s)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    colour: bool
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    pumps: list[asyncio.Task[None]] = field(default_factory=list)
    log_file: Path | None = None
    first_backoff_s: float = BACKOFF_START_S
    on_restart: list[float] = field(default_factory=list)

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            *self.argv,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        assert self.process.stdout is not None
        self.pumps = [
            asyncio.create_task(_pump(self.name, self.process.stdout, self.colour, self.log_file))
        ]

    async def keep_alive(self, stopping: asyncio.Event) -> None:
        """Run the process; restart it when it exits, with backoff, until `stopping`."""
        delay = self.first_backoff_s
        while not stopping.is_set():
            started = time.monotonic()
            await self.start()
            assert self.process is not None
            code = await self.process.wait()
            if stopping.is_set():
                return
            if time.monotonic() - started > STABLE_AFTER_S:
                delay = self.first_backoff_s
            self.restarts += 1
            self.on_restart.append(time.monotonic())
            _say(
                "up",
                f"{self.name} exited with status {code}; restart #{self.restarts} in {delay:.0f} s",
                self.colour,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), delay)
            delay = min(BACKOFF_MAX_S, delay * 2)

    async def stop(self, grace_s: float) -> None:
        """SIGTERM, then SIGKILL after `grace_s`."""
        if self.process is None or self.process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.process.wait(), grace_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()
        for pump in self.pumps:
            pump.cancel()


def temporal_argv(db_file: Path, port: int, ui_port: int | None) -> list[str]:
    """`temporal server start-dev` on 127.0.0.1 with persistent SQLite and our settings."""
    argv = [temporal_cli(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port)]
    argv += ["--ui-port", str(ui_port)] if ui_port else ["--headless"]
    argv += [*sqlite_file_args(db_file), "--log-level", "warn"]
    return [*argv, *search_attribute_flags(), *dev_server_args()]


async def wait_port(port: int, process: Supervised | None = None, timeout_s: float = 30) -> None:
    """Wait until 127.0.0.1:`port` accepts connections (or the process exits)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _port_open("127.0.0.1", port):
            return
        if process is not None and process.process is not None:
            if process.process.returncode is not None:
                raise RuntimeError(f"{process.name} exited before opening port {port}")
        await asyncio.sleep(0.1)
    raise RuntimeError(f"nothing listened on port {port} within {timeout_s:.0f} s")


async def _temporal(data_dir: Path, colour: bool) -> Supervised:
    argv = temporal_argv(data_dir / "temporal.sqlite", TEMPORAL_PORT, TEMPORAL_UI_PORT)
    server = Supervised("temporal", argv, role_env("temporal", dict(os.environ)), colour)
    await server.start()
    await wait_port(TEMPORAL_PORT, server)
    return server


async def up(settings: Settings | None = None) -> int:
    """Start everything and wait for Ctrl-C (or SIGTERM); return the exit status."""
    settings = settings or Settings()
    colour = sys.stdout.isatty()
    data_dir = settings.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)

    url = resolve_url(settings)
    applied = await migrate_url(url)
    _say(
        "up",
        f"database ready ({'embedded' if not settings.database_url else 'configured'}); "
        f"migrations applied: {applied or 'none needed'}",
        colour,
    )
    temporal: Supervised | None = None
    address = settings.temporal_address
    if not address:
        temporal = await _temporal(data_dir, colour)
        address = f"127.0.0.1:{TEMPORAL_PORT}"
    env = dict(os.environ)
    env.update(
        RECEIPT_DATABASE_URL=url,
        RECEIPT_TEMPORAL_ADDRESS=address,
        RECEIPT_LOG_FORMAT="human" if colour else env.get("RECEIPT_LOG_FORMAT", "json"),
        PYTHONUNBUFFERED="1",
    )
    roles = [
        Supervised(role, [sys.executable, "-m", "roles.role", role], role_env(role, env), colour)
        for role in ROLES
    ]
    keepers = [asyncio.create_task(r.keep_alive(stopping)) for r in roles]
    host = os.environ.get("RECEIPT_API_HOST", "127.0.0.1")
    port = os.environ.get("RECEIPT_API_PORT", "8000")
    metrics = ", ".join(f"{r} :{p}" for r, p in DEFAULT_METRICS_PORTS.items() if r in ROLES)
    for line in (
        f"API          http://{host}:{port}   (docs: http://{host}:{port}/docs)",
        f"Temporal UI  http://127.0.0.1:{TEMPORAL_UI_PORT}"
        if temporal
        else f"Temporal     {address}",
        f"Metrics      http://{host}:{port}/metrics (api); {metrics}",
        f"Data         {data_dir.resolve()}",
        "Ctrl-C stops everything.",
    ):
        _say("up", line, colour)
    await stopping.wait()
    _say("up", "stopping: roles first (they finish or release held jobs), then Temporal", colour)
    grace = int(os.environ.get("RECEIPT_SHUTDOWN_GRACE_MS", "30000")) / 1000 + 5
    await asyncio.gather(*(r.stop(grace) for r in roles))
    for keeper in keepers:
        keeper.cancel()
    await asyncio.gather(*keepers, return_exceptions=True)
    if temporal is not None:
        await temporal.stop(10)
    _say("up", "stopped", colour)
    return 0
