"""The api's HTTP/1.1 parser: httptools (uvicorn's fastest) with a bound on a request's head.

httptools hands uvicorn each header as it parses it and sets no limit on their total, so a
client (before any token is read) could make the api hold megabytes of headers per connection
(measured: 64 MiB sent, 64 MiB more resident). This protocol counts the head's bytes as they
come and refuses the request past `MAX_REQUEST_HEAD_BYTES` (400, the connection closed, as
uvicorn answers any request it cannot parse). Without httptools, h11 applies its own limit.
"""

from __future__ import annotations

from typing import Any

MAX_REQUEST_HEAD_BYTES = 64 * 1024  # the URL and every header: tokens, traceparent, cookies


class RequestHeadTooLarge(ValueError):
    """Raised from a parser callback: uvicorn answers it as an invalid request."""


def http_protocol() -> Any:
    """What `uvicorn.Config(http=…)` takes for the api: the bounded httptools protocol, or
    `"h11"` where httptools is not installed."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return "h11"

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        """HttpToolsProtocol refusing a request whose URL and headers pass the bound."""

        _head_bytes = 0

        def on_message_begin(self) -> None:
            self._head_bytes = 0
            super().on_message_begin()

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
