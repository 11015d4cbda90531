"""Local TCP ports: pick a free one, see whether one is open, wait until one opens.

Shared by `receipt up`, the tools (bench, chaos) and the end-to-end tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import time
from collections.abc import Callable
from pathlib import Path

LOOPBACK = "127.0.0.1"
_PICK_FLOOR = 20000  # above the well-known and the common service ports
_PICK_TRIES = 50
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nothing listens on right now, below the kernel's ephemeral range.

    The port is free when picked, not when the caller binds it. A port the kernel picks for
    `bind(0)` comes from the ephemeral range, the one every outgoing connection's source port
    comes from too, so on a busy machine (a test suite's parallel workers) a connection could
    take it before the server bound it. A random port below that range is taken only by another
    picker that chose the same port in the same instant; it is checked bindable before it is
    returned. Falls back to the kernel's pick when no such port is found."""
    low, _ = ephemeral_range()
    for _ in range(_PICK_TRIES):
        port = random.randrange(_PICK_FLOOR, max(low, _PICK_FLOOR + 1))
        if low > _PICK_FLOOR and _bindable(host, port):
            return port
    with contextlib.closing(socket.socket()) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of source ports for outgoing connections (Linux's default elsewhere)."""
    try:
        low, high = _EPHEMERAL_RANGE.read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(host: str, port: int) -> bool:
    with contextlib.closing(socket.socket()) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def port_open(port: int, host: str = LOOPBACK) -> bool:
    """Whether something accepts TCP connections on `host:port` (half a second at most)."""
    with contextlib.closing(socket.socket()) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


async def wait_port(
    port: int,
    timeout_s: float = 30.0,
    *,
    host: str = LOOPBACK,
    exited: Callable[[], int | None] | None = None,
    name: str = "the server",
) -> None:
    """Wait until `host:port` accepts connections.

    `exited` (the process's return code, or None while it runs) stops the wait early with a
    RuntimeError when the process meant to listen there has died; so does the timeout.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if port_open(port, host):
            return
        if exited is not None and (code := exited()) is not None:
            raise RuntimeError(f"{name} exited with status {code} before opening port {port}")
        await asyncio.sleep(0.1)
    raise RuntimeError(f"nothing listened on {host}:{port} within {timeout_s:.0f} s")
