"""The AI gateway's stop once worker-codex drained (roles/delivery/serve.py `stop_gateway`):
its turn sockets' close and its token meter's last write are bounded, as the process's stop
bound (`stop_bound_s`) counts them. A real gateway on its Unix sockets, a fake provider on
loopback, the meter in real PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator

import httpx
import psycopg
import pytest

from activities.gateway import Gateway
from activities.gateway_budget import Meter
from activities.gateway_grant import Grant
from activities.gateway_providers import Budgets, Credential, Provider, Secret
from receipts.store import Store
from roles.delivery.serve import stop_gateway
from roles.infra.process import GATEWAY_CLOSE_S, LAST_FLUSH_S
from tests.fake_provider import USAGE_IN, USAGE_OUT, FakeProvider, running

ORG = f"org-stop-{uuid.uuid4().hex[:8]}"
SLOW_S = 20.0  # the provider's answer to a `slow` key: longer than any bound here


@pytest.fixture
async def gateway(store: Store) -> AsyncIterator[Gateway]:
    """A metered gateway with a provider answering `sk-ok` at once and `sk-slow` in SLOW_S."""
    with running(FakeProvider({"sk-ok": "ok", "sk-slow": "slow"}, slow_s=SLOW_S)) as fake:
        providers = {
            name: Provider(name, "openai", fake.openai_url, (Credential("c0", Secret(key), 4),))
            for name, key in (("quick", "sk-ok"), ("slow", "sk-slow"))
        }
        async with httpx.AsyncClient() as http:
            gateway = Gateway(providers, http)
            gateway.meter = Meter(store, Budgets(10**9, {}))
            yield gateway
            await gateway.close()


def turn(gateway: Gateway, binding: str) -> Grant:
    return gateway.grant(
        job_id=f"job-{binding}", attempt=1, agent_id="coder", organization_id=ORG, binding=binding
    )


async def call(grant: Grant) -> httpx.Response:
    transport = httpx.AsyncHTTPTransport(uds=str(grant.socket))
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        return await http.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": []},
            headers={"Authorization": f"Bearer {grant.token}"},
            timeout=60,
        )


def events(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == event]


async def test_a_turn_s_model_call_still_running_at_the_stop_holds_it_for_a_second_at_most(
    gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    """A grant still open once the worker drained (its handler abandoned, its command still
    calling): the gateway's close waited for that call's answer, however long the provider
    took (its read timeout is 300 s), past the pod's grace. Now it is cut after
    GATEWAY_CLOSE_S and logged `gateway.close_cut`."""
    calling = asyncio.create_task(call(turn(gateway, "slow")))
    try:
        for _ in range(100):  # the call is in flight at the provider
            if any(g.in_flight for g in gateway.grants.values()):
                break
            await asyncio.sleep(0.05)
        started = time.monotonic()
        await asyncio.wait_for(stop_gateway(gateway), 10)
        stopped_s = time.monotonic() - started
    finally:
        calling.cancel()
        await asyncio.gather(calling, return_exceptions=True)
    assert stopped_s < GATEWAY_CLOSE_S + 1
    [cut] = events(caplog, "gateway.close_cut")
    assert (getattr(cut, "grants", None), getattr(cut, "inFlight", None)) == (1, 1)


async def test_the_meter_s_last_write_to_a_database_that_does_not_answer_is_dropped_in_time(
    gateway: Gateway, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The last write of the token counts waited as long as the database did (a lock held on
    the meter's table here; a database that stops answering alike), and the worker's exit with
    it, past the pod's grace. Now it is given LAST_FLUSH_S; the counts dropped are logged."""
    assert (await call(turn(gateway, "quick"))).status_code == 200  # one call counted
    locker = await psycopg.AsyncConnection.connect(db_url)
    try:
        await locker.execute("LOCK TABLE organization_token_usage IN EXCLUSIVE MODE")
        started = time.monotonic()
        await asyncio.wait_for(stop_gateway(gateway), 10)
        stopped_s = time.monotonic() - started
    finally:
        await locker.rollback()
        await locker.close()
    assert stopped_s < LAST_FLUSH_S + 1
    [failed] = events(caplog, "gateway.usage_flush_failed")
    dropped = {k: getattr(failed, k, None) for k in ("organizations", "calls", "tokens")}
    assert dropped == {"organizations": 1, "calls": 1, "tokens": USAGE_IN + USAGE_OUT}
