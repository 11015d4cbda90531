"""The api's HTTP/1.1 parser: httptools (uvicorn's fastest) with bounds on a request's head.

httptools hands uvicorn each header as it parses it and sets no limit on their total, so a
client (before any token is read) could make the api hold megabytes of headers per connection
(measured: 64 MiB sent, 64 MiB more resident). This protocol counts the head's bytes as they
come and refuses the request past `MAX_REQUEST_HEAD_BYTES` (400, the connection closed, as
uvicorn answers any request it cannot parse). Without httptools, h11 applies its own limit.

Nor does uvicorn time a head: a connection that sends nothing, or its head a byte at a time,
was held for as long as the client liked (slowloris: each costs the api a descriptor and a
protocol, before any token is read). A head must be whole `RECEIPT_API_HEAD_TIMEOUT_MS` after
the connection opens, or after its request's first byte on a kept-alive one; past it the
connection is closed (408 when a request had begun), counted
`receipt_api_limited_total{limit="head_timeout"}`. Between requests uvicorn's keep-alive
timeout closes an idle connection.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from receipts import metrics
from receipts.refusal_log import RefusalLog

MAX_REQUEST_HEAD_BYTES = 64 * 1024  # the URL and every header: tokens, traceparent, cookies
REQUEST_TIMEOUT_ANSWER = (
    b"HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\nContent-Length: 35\r\n\r\nthe request's head came too slowly\n"
)

log = logging.getLogger("roles.api.app")
_late_heads = RefusalLog()  # logged once per 10 s per client address, counted in full


class RequestHeadTooLarge(ValueError):
    """Raised from a parser callback: uvicorn answers it as an invalid request."""


def http_protocol(head_timeout_s: float) -> Any:
    """What `uvicorn.Config(http=…)` takes for the api: the bounded httptools protocol (a head
    whole within `head_timeout_s`), or `"h11"` where httptools is not installed."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return "h11"

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        """HttpToolsProtocol refusing a request whose URL and headers pass the bound, or whose
        head is not whole in time."""

        _head_bytes = 0
        _head_deadline: asyncio.TimerHandle | None = None
        _head_begun = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._await_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._head_whole()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            self._head_bytes = 0
            self._head_begun = True
            self._await_head()  # the connection's own deadline, if it is still running
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._head_whole()
            super().on_headers_complete()

        def _await_head(self) -> None:
            if self._head_deadline is None:
                self._head_deadline = self.loop.call_later(head_timeout_s, self._head_late)

        def _head_whole(self) -> None:
            self._head_begun = False
            if self._head_deadline is not None:
                self._head_deadline.cancel()
                self._head_deadline = None

        def _head_late(self) -> None:
            self._head_deadline = None
            if self.transport.is_closing():
                return
            metrics.API_LIMITED.labels("head_timeout").inc()
            client = self.client[0] if self.client else "unknown"
            if (unlogged := _late_heads.due("head_timeout", client)) is not None:
                log.info(
                    "connection closed: its request head was not whole in %g s",
                    head_timeout_s,
                    extra={
                        "event": "api.head_timeout",
                        "client": client,
                        "began": self._head_begun,
                        "unloggedSince": unlogged,
                    },
                )
            if self._head_begun:
                self.transport.write(REQUEST_TIMEOUT_ANSWER)
            self.transport.close()

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)
            super().on_header(name, value)

        def _count(self, size: int) -> None:
            self._head_bytes += size
            if self._head_bytes > MAX_REQUEST_HEAD_BYTES:
                raise RequestHeadTooLarge(
                    f"the request's URL and headers exceed {MAX_REQUEST_HEAD_BYTES} bytes"
                )

    return BoundedHttpToolsProtocol
