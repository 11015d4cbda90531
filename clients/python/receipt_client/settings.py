"""Where the client connects and how: the defaults from the environment."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import httpx

DEFAULT_URL = "http://127.0.0.1:8000"
PAGE = 1000
STREAM_READ_TIMEOUT_S = 60.0  # the API sends a keepalive every 15 s


def connection(url: str | None, token: str | None) -> tuple[str, dict[str, str]]:
    """The base URL (`RECEIPT_API_URL`, else the default) and the headers (the bearer token,
    `RECEIPT_API_TOKEN` by default)."""
    base = (url or os.environ.get("RECEIPT_API_URL") or DEFAULT_URL).rstrip("/")
    bearer = token if token is not None else os.environ.get("RECEIPT_API_TOKEN")
    return base, {"Authorization": f"Bearer {bearer}"} if bearer else {}


def shown(url: str) -> str:
    """`url` as messages print it: a password in it written `***` (an error line lands in CI
    logs and terminals)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.netloc.rpartition("@")[0].partition(":")[0]
    return parts._replace(netloc=f"{user}:***@{parts.netloc.rpartition('@')[2]}").geturl()


def stream_timeout(timeout: httpx.Timeout, read: float = STREAM_READ_TIMEOUT_S) -> httpx.Timeout:
    """A stream's timeouts: the client's, with a read timeout of `read` (by default past the
    API's keepalive), which the connect's never outlasts."""
    connect = read if timeout.connect is None else min(timeout.connect, read)
    return httpx.Timeout(connect, read=read, write=timeout.write, pool=timeout.pool)
