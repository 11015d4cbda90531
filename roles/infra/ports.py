"""Local TCP ports: pick a free one, see whether one is open, wait until one opens.

Shared by `receipt up`, the tools (bench, chaos) and the end-to-end tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nothing listens on right now (the kernel's pick; another process may take it
    before the caller binds it, which is why callers start the server at once)."""
    with contextlib.closing(socket.socket()) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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
