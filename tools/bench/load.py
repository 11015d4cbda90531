"""Load generators: a minimal keep-alive HTTP/1.1 client (its own CPU stays small) and a closed
loop of N operations on C concurrent clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any


class HttpConnection:
    """One keep-alive HTTP/1.1 connection that sends prepared requests and reads the answers.

    httpx costs several times the CPU per request; on two cores that would come out of the
    server's share and understate the API.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body = await self.reader.readexactly(length) if length else b""
        return status, body

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()
            self.writer = None


def post_request(host: str, port: int, path: str, body: Mapping[str, Any]) -> bytes:
    """The bytes of one `POST path` with a JSON body."""
    content = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(content)}\r\n\r\n"
    )
    return head.encode() + content


async def closed_loop(
    count: int, concurrency: int, work: Callable[[int], Awaitable[None]]
) -> tuple[float, list[float]]:
    """Run `work(i)` for i < count on `concurrency` workers; return (wall s, latencies ms)."""
    latencies: list[float] = []
    counter = iter(range(count))

    async def client() -> None:
        for i in counter:
            started = time.perf_counter()
            await work(i)
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return time.perf_counter() - started, latencies
