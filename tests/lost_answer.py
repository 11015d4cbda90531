"""A loopback TCP proxy to PostgreSQL that loses one commit's answer: the statement a test names
is forwarded, the server commits it, and the connection is dropped before its answer is relayed
(what a network cut or a failover at that instant does). The client sees a lost connection (a
`TransientStorageError` at the store) for a write that was made.

It reads the wire protocol: the client's Parse, Bind and Query messages name the statement
(`match` is looked for in the SQL text and in the Bind's parameters), and once one matches, the
server's answers on that connection are held until its next ReadyForQuery: one saying the
connection is idle again (`I`: the transaction, or the one statement, committed) is never
relayed and both sides are closed; one saying a transaction is still open is relayed with
what it held. One connection is cut, then the proxy forwards everything. The URL must ask for
no TLS or GSS encryption (`url`)."""

from __future__ import annotations

import asyncio
import contextlib
import struct

from psycopg.conninfo import conninfo_to_dict, make_conninfo


class LostAnswerProxy:
    """Forwards `127.0.0.1:<port>` to the server of `server_url`; `arm(match)` has it lose the
    answer of the next commit of a statement holding `match`."""

    def __init__(self, server_url: str) -> None:
        params = conninfo_to_dict(server_url)
        self._server_url = server_url
        self.target = (str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
        self.port = 0
        self._server: asyncio.Server | None = None
        self._match: bytes | None = None
        self.lost: list[str] = []  # the command tags of the answer lost (what was committed)
        self.cut = asyncio.Event()

    async def start(self) -> LostAnswerProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()

    def url(self, url: str | None = None) -> str:
        """`url` (the server's by default) through this proxy, in the clear."""
        return make_conninfo(
            url or self._server_url,
            host="127.0.0.1",
            port=self.port,
            sslmode="disable",
            gssencmode="disable",
        )

    def arm(self, match: str | bytes) -> None:
        """Lose the answer of the next commit of a statement whose text or parameters hold
        `match`."""
        self._match = match.encode() if isinstance(match, str) else match
        self.lost = []
        self.cut.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        link = _Link(self, writer, up_writer)
        try:
            await asyncio.gather(link.from_client(reader), link.from_server(up_reader))
        finally:
            writer.transport.abort()
            up_writer.transport.abort()


class _Link:
    def __init__(
        self, proxy: LostAnswerProxy, client: asyncio.StreamWriter, server: asyncio.StreamWriter
    ) -> None:
        self.proxy = proxy
        self.client = client
        self.server = server
        self.statements: dict[bytes, bytes] = {}
        self.matched = False

    def _claims(self, text: bytes) -> bool:
        match = self.proxy._match
        if match is not None and match in text:
            self.proxy._match = None  # one connection is cut
            return True
        return False

    async def from_client(self, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            head = await reader.readexactly(4)  # the startup message: untyped
            (length,) = struct.unpack("!i", head)
            self.server.write(head + await reader.readexactly(length - 4))
            while True:
                kind = await reader.readexactly(1)
                head = await reader.readexactly(4)
                (length,) = struct.unpack("!i", head)
                body = await reader.readexactly(length - 4)
                if kind == b"P":
                    name, rest = body.split(b"\0", 1)
                    self.statements[name] = rest.split(b"\0", 1)[0]
                elif kind == b"B":
                    _portal, name, _rest = body.split(b"\0", 2)
                    if self._claims(self.statements.get(name, b"") + b"\0" + body):
                        self.matched = True
                elif kind == b"Q" and self._claims(body):
                    self.matched = True
                self.server.write(kind + head + body)
                await self.server.drain()
        self.server.transport.abort()

    async def from_server(self, reader: asyncio.StreamReader) -> None:
        held: list[bytes] = []
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                kind = await reader.readexactly(1)
                head = await reader.readexactly(4)
                (length,) = struct.unpack("!i", head)
                body = await reader.readexactly(length - 4)
                message = kind + head + body
                if not self.matched:
                    self.client.write(message)
                    await self.client.drain()
                    continue
                if kind == b"C":
                    self.proxy.lost.append(body.rstrip(b"\0").decode())
                if kind == b"Z" and body == b"I":  # committed: its answer is never relayed
                    self.proxy.cut.set()
                    break
                held.append(message)
                if kind == b"Z":  # a transaction still open: relay what was held
                    self.client.write(b"".join(held))
                    held = []
                    await self.client.drain()
        self.client.transport.abort()
        self.server.transport.abort()
