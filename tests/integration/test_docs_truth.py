"""What the docs say, held to what the code does (the docs audit of 2026-12-07: each statement
found untrue, with a test that fails before its fix)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from receipt_client import AsyncClient, NotFound
from tests.integration.api_support import api_client

OPEN_URL = "http://127.0.0.1:8000"


@pytest.fixture
async def open_api(db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(db_url, tokens=None, host="127.0.0.1", base_url=OPEN_URL) as client:
        yield client


@pytest.mark.parametrize(
    "call",
    [
        lambda api: api.retry("no-such-job"),
        lambda api: api.cancel_objective("no-such-objective"),
        lambda api: api.cancel_agent_job("no-such-agent-job"),
        lambda api: api.rotate_webhook_secret("wh_none"),
        lambda api: api.test_webhook("wh_none"),
    ],
    ids=["retry", "cancel_objective", "cancel_agent_job", "rotate_webhook_secret", "test_webhook"],
)
async def test_the_clients_bodyless_posts_reach_an_open_api(
    open_api: httpx.AsyncClient, call: Callable[[AsyncClient], Awaitable[Any]]
) -> None:
    """README: an open API refuses "a non-JSON body" (415); the client's posts without a body
    (a retry, a cancel without a reason, a secret's rotation, a test delivery, and the CLI's
    `receipt jobs retry`) declared no media type and were refused 415 as one."""
    async with AsyncClient(OPEN_URL, transport=open_api._transport) as api:
        with pytest.raises(NotFound):
            await call(api)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/objectives"),
        ("POST", "/objectives/some-objective/cancel"),
        ("POST", "/schedules"),
        ("PATCH", "/schedules/some-schedule"),
        ("POST", "/webhooks"),
        ("POST", "/webhooks/wh_none/rotate-secret"),
        ("POST", "/webhooks/wh_none/test"),
        ("POST", "/agent-jobs"),
        ("POST", "/agent-jobs/some-agent-job/input"),
        ("POST", "/agent-jobs/some-agent-job/cancel"),
        ("POST", "/console/agent-jobs/some-agent-job/cancel"),
        ("POST", "/jobs/some-job/retry"),
    ],
)
async def test_every_post_documents_the_open_modes_415(
    open_api: httpx.AsyncClient, method: str, path: str
) -> None:
    """README: an open API answers "415 a non-JSON body"; the OpenAPI document listed 415 on
    three routes only (`api_client`'s hook asserts every status answered is documented)."""
    answer = await open_api.request(
        method, path, content=b"{}", headers={"Content-Type": "text/plain"}
    )
    assert answer.status_code == 415
