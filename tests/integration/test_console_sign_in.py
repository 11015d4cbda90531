"""The console's budget of refused sign-ins against a real api process: tries whose bodies
arrive slowly, all in flight at once, are counted as they end — none passes the budget because
the others had not been counted yet."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from roles.api.console.session import SIGN_IN_BURST
from tests.integration.api_support import RunningApi, running_api

TRIES = SIGN_IN_BURST + 5


@pytest.fixture(scope="module")
def api(db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    with running_api(db_url, Path(tmp_path_factory.mktemp("sign-in"))) as api:
        yield api


async def _slow_try(host: str, port: int, n: int, go: asyncio.Event) -> int:
    """POST a wrong token whose body's last byte waits for `go`; return the status."""
    body = f"token=guess-{n:04d}".encode()
    reader, writer = await asyncio.open_connection(host, port)
    head = (
        "POST /console/login HTTP/1.1\r\n"
        f"Host: {host}:{port}\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    writer.write(head.encode() + body[:-1])
    await writer.drain()
    await go.wait()
    writer.write(body[-1:])
    await writer.drain()
    status_line = await reader.readline()
    writer.close()
    return int(status_line.split()[1])


async def test_slow_tries_all_in_flight_are_counted_against_the_budget(api: RunningApi) -> None:
    url = urlsplit(api.url)
    assert url.hostname is not None and url.port is not None
    go = asyncio.Event()
    tries = [asyncio.create_task(_slow_try(url.hostname, url.port, n, go)) for n in range(TRIES)]
    await asyncio.sleep(0.5)  # every request's head is in and its body waits
    go.set()
    statuses = sorted(await asyncio.gather(*tries))
    assert statuses.count(401) == SIGN_IN_BURST, statuses
    assert statuses.count(429) == TRIES - SIGN_IN_BURST, statuses
