"""How a sandboxed command reaches the AI gateway and nothing else.

The sandbox has no network of its own (a fresh namespace with only loopback). The gateway's Unix
socket is bound into it read-only at `SOCKET_DIR`, and the command runs under a small forwarder
(`FORWARDER`, the standard library only, run by the system's python3) that listens on
127.0.0.1:`port` inside the sandbox and relays each connection to that socket. The command is
told the gateway's base URLs and its turn's token (`Access.env`); provider keys never enter.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

SOCKET_DIR = "/run/receipt-gateway"

FORWARDER = r"""
import os, signal, socket, subprocess, sys, threading
port, target, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", port))
server.listen(64)
def pipe(source, sink):
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    try:
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass
def serve():
    while True:
        client, _ = server.accept()
        upstream = socket.socket(socket.AF_UNIX)
        try:
            upstream.connect(target)
        except OSError:
            client.close()
            continue
        threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
        threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()
threading.Thread(target=serve, daemon=True).start()
child = subprocess.Popen(argv)
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, lambda n, _: child.send_signal(n))
code = child.wait()
os._exit(128 - code if code < 0 else code)
"""


@dataclass(frozen=True)
class Access:
    """One command's way to the gateway: the host's socket and the port the forwarder listens
    on inside the sandbox (any: the sandbox's loopback is its own)."""

    socket: Path
    port: int

    def socket_inside(self, confined: bool) -> str:
        """The socket's path as the forwarder sees it (bound at SOCKET_DIR in the sandbox)."""
        return f"{SOCKET_DIR}/{self.socket.name}" if confined else str(self.socket)

    def env(self, token: str) -> dict[str, str]:
        """What the command is told: the gateway's base URLs in the forms agent CLIs read, and
        the turn's token as their key."""
        base = f"http://127.0.0.1:{self.port}"
        return {
            "MODEL_GATEWAY_URL": base,
            "MODEL_GATEWAY_TOKEN": token,
            "OPENAI_BASE_URL": f"{base}/v1",
            "OPENAI_API_KEY": token,
            "ANTHROPIC_BASE_URL": base,
            "ANTHROPIC_API_KEY": token,
        }

    def wrap(self, argv: list[str], *, confined: bool, path: str) -> list[str]:
        """`argv` run under the forwarder; SandboxRefused-worthy ValueError when the system has
        no python3 on `path` to run it."""
        python = shutil.which("python3", path=path)
        if python is None:
            raise ValueError(f"no python3 on PATH {path!r} to run the gateway forwarder")
        inside = self.socket_inside(confined)
        return [python, "-I", "-S", "-c", FORWARDER, str(self.port), inside, *argv]

    def bind_args(self) -> list[str]:
        """bwrap's options that bind the gateway's socket directory into the sandbox."""
        return ["--ro-bind", str(self.socket.parent), SOCKET_DIR]


def free_port() -> int:
    """A loopback port nothing listens on now: the forwarder's inside the sandbox (whose
    loopback is its own, so any would do) or, unconfined, on the host."""
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
