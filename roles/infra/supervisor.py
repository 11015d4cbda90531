"""Child processes started, watched, restarted and stopped by their PID.

One supervisor for `receipt up` (every role kept alive with a restart backoff), the tools
(bench, chaos) and the end-to-end tests. A child runs in a session of its own, so a Ctrl-C at
the terminal reaches only the parent, which then stops its children in order. Its output goes
to a log file, or line by line to this process's stdout behind a `name |` prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from receipts.waits import within

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
# A process that ran this long before dying restarts after the first backoff again.
STABLE_AFTER_S = 60.0
POLL_S = 0.1


def say(name: str, line: str, colour: bool) -> None:
    """Write one line to stdout behind a right-aligned `name |` prefix (coloured on a tty)."""
    prefix = f"{name:>14} | "
    if colour:
        prefix = f"{COLOURS.get(name, '')}{prefix}{RESET}"
    sys.stdout.write(prefix + line.rstrip("\n") + "\n")
    sys.stdout.flush()


def _pump(name: str, stream: IO[bytes], colour: bool) -> None:
    with contextlib.suppress(ValueError, OSError):  # the pipe closed under us at exit
        for raw in stream:
            say(name, raw.decode(errors="replace"), colour)


@dataclass
class Supervised:
    """One child process: start, signal, stop (SIGTERM, then SIGKILL after a grace), and
    optionally keep alive (restart with a backoff of 1 s doubling to 30 s)."""

    name: str
    argv: list[str]
    env: dict[str, str] | None = None
    colour: bool = False
    log_file: Path | None = None
    cwd: Path | None = None
    first_backoff_s: float = BACKOFF_START_S
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    on_restart: list[float] = field(default_factory=list)

    def start(self) -> subprocess.Popen[bytes]:
        """Start the process (its output to `log_file`, else prefixed on stdout)."""
        if self.log_file is not None:
            with open(self.log_file, "ab") as log:
                self.process = self._spawn(log)
            return self.process
        self.process = self._spawn(subprocess.PIPE)
        assert self.process.stdout is not None
        threading.Thread(
            target=_pump,
            args=(self.name, self.process.stdout, self.colour),
            name=f"output of {self.name}",
            daemon=True,
        ).start()
        return self.process

    def _spawn(self, stdout: IO[bytes] | int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=self.cwd,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.process.pid

    def returncode(self) -> int | None:
        """The exit status, or None while the process runs (or was never started)."""
        return None if self.process is None else self.process.poll()

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def send(self, sig: signal.Signals) -> None:
        """Send `sig` to the process if it still runs."""
        if self.running():
            assert self.process is not None
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)

    def kill(self, wait_s: float = 10.0) -> None:
        """SIGKILL and reap."""
        self.send(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(wait_s)

    async def wait(self) -> int:
        """Wait (polling, so no thread or child watcher is held) until the process exits."""
        assert self.process is not None
        while (code := self.process.poll()) is None:  # noqa: ASYNC110 - nothing to wait on
            await asyncio.sleep(POLL_S)
        return code

    def stop(self, grace_s: float) -> None:
        """SIGTERM (SIGCONT first, for a stopped process), then SIGKILL after `grace_s`."""
        if not self.running():
            return
        assert self.process is not None
        self.send(signal.SIGCONT)
        self.send(signal.SIGTERM)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.kill()

    async def stop_async(self, grace_s: float, forced: asyncio.Event | None = None) -> None:
        """`stop` without blocking the event loop (several children drain at once); SIGKILL
        sooner, at once, when `forced` is set (a second Ctrl-C)."""
        if not self.running():
            return
        self.send(signal.SIGCONT)
        self.send(signal.SIGTERM)
        ended = asyncio.create_task(self.wait())
        forcing = asyncio.create_task((forced or asyncio.Event()).wait())
        try:
            await asyncio.wait(
                {ended, forcing}, timeout=grace_s, return_when=asyncio.FIRST_COMPLETED
            )
        except BaseException:
            ended.cancel()
            raise
        finally:
            forcing.cancel()
        if not ended.done():
            self.send(signal.SIGKILL)
        await ended

    async def keep_alive(self, stopping: asyncio.Event) -> None:
        """Run the process; restart it when it exits, with backoff, until `stopping`."""
        delay = self.first_backoff_s
        while not stopping.is_set():
            started = time.monotonic()
            self.start()
            code = await self.wait()
            if stopping.is_set():
                return
            if time.monotonic() - started > STABLE_AFTER_S:
                delay = self.first_backoff_s
            self.restarts += 1
            self.on_restart.append(time.monotonic())
            say(
                "up",
                f"{self.name} exited with status {code}; restart #{self.restarts} in {delay:.0f} s",
                self.colour,
            )
            with contextlib.suppress(TimeoutError):
                await within(stopping.wait(), delay)
            delay = min(BACKOFF_MAX_S, delay * 2)
