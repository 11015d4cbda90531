"""Each organization's daily token budget at the AI gateway (activities/gateway_budget.py): a real
gateway on its Unix sockets, a fake provider on loopback, the meter in real PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from activities.gateway import Gateway
from activities.gateway_budget import BUDGET_QUOTA, Meter
from activities.gateway_grant import Grant
from activities.gateway_providers import Budgets, Credential, Provider, Secret
from activities.gateway_usage import Usage
from receipts.store import Store
from tests.fake_provider import USAGE_IN, USAGE_OUT, FakeProvider, running

ONE_CALL = USAGE_IN + USAGE_OUT  # the tokens of one call to the fake provider


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with running(FakeProvider({"sk-ok": "ok"})) as fake:
        yield fake


@pytest.fixture
def orgs() -> tuple[str, str]:
    """Two organizations of this test alone (the meter's rows stay in the shared database)."""
    run = uuid.uuid4().hex[:8]
    return f"org-a-{run}", f"org-b-{run}"


@pytest.fixture
async def metered(
    fake: FakeProvider, store: Store, orgs: tuple[str, str]
) -> AsyncIterator[Gateway]:
    """A gateway whose first organization may spend two calls' tokens a day (the other: none)."""
    providers = {
        "openai": Provider(
            "openai", "openai", fake.openai_url, (Credential("c0", Secret("sk-ok"), 4),)
        )
    }
    async with httpx.AsyncClient() as http:
        gateway = Gateway(providers, http)
        gateway.meter = Meter(store, Budgets(0, {orgs[0]: 2 * ONE_CALL}))
        yield gateway
        await gateway.close()


def turn(gateway: Gateway, organization: str, job: str = "job") -> Grant:
    return gateway.grant(
        job_id=job, attempt=1, agent_id="coder", organization_id=organization, binding="openai"
    )


async def call(grant: Grant) -> httpx.Response:
    transport = httpx.AsyncHTTPTransport(uds=str(grant.socket))
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        return await http.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": []},
            headers={"Authorization": f"Bearer {grant.token}"},
            timeout=30,
        )


def next_midnight() -> datetime:
    now = datetime.now(UTC)
    return datetime(now.year, now.month, now.day, tzinfo=UTC) + timedelta(days=1)


async def spent_today(store: Store, organization: str) -> tuple[int, int, int]:
    async with store.connection() as conn:
        cur = await conn.execute(
            "SELECT calls, input_tokens, output_tokens FROM organization_token_usage"
            " WHERE organization_id = %s AND day = (now() AT TIME ZONE 'UTC')::date",
            (organization,),
        )
        row = await cur.fetchone()
    return (0, 0, 0) if row is None else (row[0], row[1], row[2])


async def test_calls_past_an_organization_s_daily_budget_are_refused_until_its_day_renews(
    metered: Gateway, fake: FakeProvider, store: Store, orgs: tuple[str, str]
) -> None:
    """Two calls' tokens a day: the third call of the organization, in another turn even, is
    the provider's 429 naming the budget, with `retry-after` until the next UTC midnight, and
    the turn meets quota until then (it settles as a placement delay). Another organization,
    with no budget, is not held back."""
    org_a, org_b = orgs
    first, second = turn(metered, org_a, "job-1"), turn(metered, org_a, "job-2")
    assert (await call(first)).status_code == 200
    assert (await call(second)).status_code == 200
    refused = await call(second)
    assert refused.status_code == 429
    message = refused.json()["error"]["message"]
    assert f"daily token budget ({2 * ONE_CALL}) is spent ({2 * ONE_CALL} today)" in message
    wait_s = int(refused.headers["retry-after"])
    assert abs((next_midnight() - datetime.now(UTC)).total_seconds() - wait_s) < 5
    assert second.quota_models == {BUDGET_QUOTA: next_midnight()}
    assert first.quota_until is None  # a turn is only told when it calls
    assert len(fake.calls) == 2  # the refused call never reached the provider
    assert (await call(turn(metered, org_b, "job-3"))).status_code == 200
    # Its counts reach the database's meter at the flush: two calls each way.
    assert metered.meter is not None
    await metered.meter.flush()
    assert await spent_today(store, org_a) == (2, 2 * USAGE_IN, 2 * USAGE_OUT)
    assert await spent_today(store, org_b) == (1, USAGE_IN, USAGE_OUT)


async def test_every_process_counts_against_one_spend(store: Store, orgs: tuple[str, str]) -> None:
    """Two worker-codex processes (two meters on one database): what one flushed is spent for
    the other once it reads the meter again, and what each counted since is its own to add."""
    org = orgs[0]
    here, there = Meter(store, Budgets(100)), Meter(store, Budgets(100))
    assert (await there.spent(org))[0] == 0
    here.count(org, Usage(30, 10))
    here.count(org, Usage(5, 5))
    assert (await here.spent(org))[0] == 50  # read at 0, plus its own counts
    assert await here.flush() == 1
    assert (await here.spent(org))[0] == 50  # flushed: the same spend, not twice
    there._reads.clear()  # as REFRESH_S later
    there.count(org, Usage(1, 1))
    assert (await there.spent(org))[0] == 52
    assert await spent_today(store, org) == (2, 35, 15)


async def test_a_failed_flush_keeps_its_counts_for_the_next(
    store: Store, orgs: tuple[str, str]
) -> None:
    """The database refuses a flush (here its table is away): the flush raises for its loop to
    log and count, nothing is lost, and the next flush writes every count once."""
    org = orgs[0]
    meter = Meter(store, Budgets(100))
    meter.count(org, Usage(4, 2))
    async with store.connection() as conn:
        await conn.execute("ALTER TABLE organization_token_usage RENAME TO usage_away")
    try:
        with pytest.raises(Exception, match="organization_token_usage"):
            await meter.flush()
        meter.count(org, Usage(1, 1))
    finally:
        async with store.connection() as conn:
            await conn.execute("ALTER TABLE usage_away RENAME TO organization_token_usage")
    assert await meter.flush() == 1
    assert await spent_today(store, org) == (2, 5, 3)
    assert await meter.flush() == 0
