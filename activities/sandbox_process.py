"""A spawned sandbox's processes (activities/sandbox.py spawns it): the host pid of its PID
namespace's first process, read from bwrap's --info-fd, how to kill the whole sandbox, and how to
wait until every process of it is gone."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import select
import signal
import time

from activities.blocking import off_loop
from activities.sandbox_policy import GONE_TIMEOUT_S, TERM_GRACE_S
from receipts.waits import within


class Running:
    """A spawned sandbox: the outer process and, from bwrap's --info-fd, the host pid of the
    PID namespace's first process (when it dies, the kernel kills everything in the namespace)."""

    def __init__(self, process: asyncio.subprocess.Process, info_fd: int | None) -> None:
        self.process = process
        self.info_fd = info_fd
        self.inner_pid: int | None = None
        self.finished = info_fd is None

    def _read_inner_pid(self, timeout_s: float | None = None) -> None:
        if self.info_fd is None or self.inner_pid is not None:
            return
        # bwrap writes {"child-pid": N} right after cloning, before the command runs, and
        # closes the pipe; a bwrap that failed earlier closed it empty. Within `timeout_s`
        # when given: a start-up chain stalled before bwrap (it holds the pipe's write end)
        # must not hold a kill for ever — the kill of its process group ends it, and the read
        # after that sees the pipe closed.
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        os.set_blocking(self.info_fd, True)
        data = b""
        with contextlib.suppress(OSError):
            # Up to the object's end, not EOF: the command may hold the pipe open.
            while b"}" not in data:
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0 or not select.select([self.info_fd], [], [], left)[0]:
                        return  # not read: the caller kills the process group
                if not (chunk := os.read(self.info_fd, 4096)):
                    break
                data += chunk
        found = re.search(rb'"child-pid"\s*:\s*(\d+)', data)
        self.inner_pid = int(found[1]) if found else None

    async def gone(self) -> None:
        """Wait until the namespace's first process (and so every process in it) is gone."""
        if self.info_fd is not None:
            await off_loop(self._read_inner_pid)
        if self.inner_pid is not None:
            await exited(self.inner_pid, GONE_TIMEOUT_S)
        self.finished = True

    async def kill(self, confined: bool) -> None:
        """Kill the whole sandbox: SIGKILL its namespace's first process (which takes every
        process of the PID namespace with it), so that bwrap, our child, reaps it and exits;
        bwrap itself is SIGKILLed only if it does not. Unconfined: SIGTERM the process group,
        then SIGKILL it after a grace; processes that left the group are not reached."""
        if confined:
            if self.info_fd is not None and self.process.returncode is None:
                # The info pipe is written before the command runs: read it without blocking
                # the loop for long (bwrap has forked by the time we can abort).
                await off_loop(self._read_inner_pid, TERM_GRACE_S)
            if self.inner_pid is not None:
                # Killing bwrap first would orphan that process to whatever reaps orphans (a
                # worker that is PID 1 in its container never would: a zombie per abort).
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(self.inner_pid, signal.SIGKILL)
                with contextlib.suppress(TimeoutError):
                    await within(asyncio.shield(self.process.wait()), TERM_GRACE_S)
            signal_group(self.process.pid, signal.SIGKILL)
            await self.process.wait()
            await self.gone()
            return
        signal_group(self.process.pid, signal.SIGTERM)
        try:
            await within(self.process.wait(), TERM_GRACE_S)
        except TimeoutError:
            signal_group(self.process.pid, signal.SIGKILL)
            await self.process.wait()
        self.finished = True

    def close(self) -> None:
        if self.info_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.info_fd)
            self.info_fd = None


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def exited(pid: int, timeout_s: float) -> None:
    """Wait (at most `timeout_s`) until `pid`, not our child, has exited: its pidfd turns
    readable then. The first process of a PID namespace exits only after every other one."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    exited = asyncio.Event()
    loop.add_reader(pidfd, exited.set)
    try:
        with contextlib.suppress(TimeoutError):
            await within(exited.wait(), timeout_s)
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
