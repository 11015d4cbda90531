"""A local HTTP receiver for callback tests (loopback only)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    answered_at: float = 0.0  # time.time() when its answer was written


class Receiver:
    """Accepts POSTs on 127.0.0.1 and records them.

    Its port is an ephemeral one that another test may have probed a moment ago (a `port_open`
    check, a `/healthz` poll of a server that was to bind it): only a POST is a callback;
    anything else is answered 404 and kept in `strays`, and a wait that times out says what
    did arrive."""

    def __init__(self, hold: Mapping[str, float] | None = None) -> None:
        # Seconds to wait before answering a post of each callback event (a slow receiver).
        self.hold = dict(hold or {})
        self.requests: list[Received] = []
        self.strays: list[bytes] = []
        self._server: asyncio.Server | None = None
        self._arrived = asyncio.Condition()

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/hook"

    async def __aenter__(self) -> Receiver:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self, *exc: type[BaseException] | BaseException | TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request_line = await reader.readline()
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        posted = request_line.startswith(b"POST ")
        if posted and self.hold:
            with contextlib.suppress(ValueError, AttributeError):
                await asyncio.sleep(self.hold.get(json.loads(body).get("event"), 0.0))
        writer.write(
            b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"
            if posted
            else b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        await writer.drain()
        writer.close()
        if not posted:
            self.strays.append(request_line)
            return
        async with self._arrived:
            self.requests.append(Received(headers, body, time.time()))
            self._arrived.notify_all()

    async def wait_for(self, count: int, timeout: float = 20) -> None:
        try:
            async with self._arrived:
                await asyncio.wait_for(
                    self._arrived.wait_for(lambda: len(self.requests) >= count), timeout
                )
        except TimeoutError:
            got = [r.body[:120] for r in self.requests]
            raise AssertionError(
                f"{count} posts not received within {timeout} s; got {got}, strays {self.strays}"
            ) from None

    @staticmethod
    def verify(request: Received, key: bytes) -> bool:
        message = (
            f"{request.headers['webhook-id']}.{request.headers['webhook-timestamp']}.".encode()
            + request.body
        )
        expected = base64.b64encode(hmac.new(key, message, hashlib.sha256).digest()).decode()
        return request.headers["webhook-signature"] == f"v1,{expected}"
