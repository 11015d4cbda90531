"""Each organization's daily token budget at the AI gateway (activities/gateway_budget.py): a real
gateway on its Unix sockets, a fake provider on loopback, the meter in real PostgreSQL."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import cast

import httpx
import pytest

from activities.gateway import MAX_CALLS_PER_GRANT, Gateway
from activities.gateway_budget import PRUNE_S, READ_TIMEOUT_S, REFRESH_S, Meter
from activities.gateway_grant import BUDGET_QUOTA, Grant
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


class _Slowed:
    """A store whose meter reads (and flushes) wait `delay_s` first, or raise `down` (the
    database away): what the gateway's calls meet while the meter is read."""

    def __init__(self, store: Store, delay_s: float = 0.0, down: Exception | None = None):
        self.store, self.delay_s, self.down = store, delay_s, down

    async def fetch_one(self, name: str, params: dict[str, object]) -> object:
        await asyncio.sleep(self.delay_s)
        if self.down is not None:
            raise self.down
        return await self.store.fetch_one(name, params)

    async def fetch(self, name: str, params: dict[str, object]) -> object:
        await asyncio.sleep(self.delay_s)
        if self.down is not None:
            raise self.down
        return await self.store.fetch(name, params)


def _meter(
    store: Store, budgets: Budgets, delay_s: float = 0.0, down: Exception | None = None
) -> Meter:
    return Meter(cast(Store, _Slowed(store, delay_s, down)), budgets)


async def test_a_turn_s_calls_in_flight_stay_capped_while_its_budget_is_read(
    fake: FakeProvider, store: Store, orgs: tuple[str, str]
) -> None:
    """A turn has at most MAX_CALLS_PER_GRANT calls in flight, counted before the budget is
    read: calls that arrive while the meter is read do not all pass the cap and reach the
    provider together."""
    fake.keys["sk-ok"] = "slow"  # each call is in flight for a second
    providers = {
        "openai": Provider(
            "openai", "openai", fake.openai_url, (Credential("c0", Secret("sk-ok"), 32),)
        )
    }
    async with httpx.AsyncClient() as http:
        gateway = Gateway(providers, http)
        gateway.meter = _meter(store, Budgets(10**9), delay_s=0.5)
        try:
            grant = turn(gateway, orgs[0])
            answers = await asyncio.gather(*(call(grant) for _ in range(MAX_CALLS_PER_GRANT + 4)))
        finally:
            await gateway.close()
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] * MAX_CALLS_PER_GRANT + [429] * 4
    assert len(fake.calls) == MAX_CALLS_PER_GRANT


async def test_a_call_is_answered_when_the_meter_cannot_be_read(
    metered: Gateway, fake: FakeProvider, store: Store, orgs: tuple[str, str]
) -> None:
    """The database away (the meter not read within READ_TIMEOUT_S, or the read failing): the
    budget is checked against the last read, or not at all before the first — a call neither
    waits on the database nor fails for it (the budget may be passed by what is spent
    meanwhile, as README says of calls in flight)."""
    assert metered.meter is not None
    metered.meter = _meter(store, metered.meter.budgets, down=OSError("the database is away"))
    started = time.monotonic()
    assert (await call(turn(metered, orgs[0]))).status_code == 200
    metered.meter = _meter(store, metered.meter.budgets, delay_s=3600)
    assert (await call(turn(metered, orgs[0], "job-2"))).status_code == 200
    assert time.monotonic() - started < 2 * READ_TIMEOUT_S + 5
    assert len(fake.calls) == 2


async def test_a_refusal_met_once_holds_while_the_meter_cannot_be_read(
    store: Store, orgs: tuple[str, str]
) -> None:
    """Spent as last read, the budget stays spent when a later read fails."""
    meter = _meter(store, Budgets(10))
    meter.count(orgs[0], Usage(6, 6))
    assert (await meter.spent(orgs[0]))[0] == 12
    assert await meter.flush() == 1  # in the meter's last read now, not this process's counts
    meter.store = cast(Store, _Slowed(store, down=OSError("the database is away")))
    meter._reads[orgs[0]].at -= REFRESH_S + 1  # stale: read again, which fails
    assert (await meter.spent(orgs[0]))[0] == 12


async def test_a_new_day_starts_from_nothing_read_or_unread(
    store: Store, orgs: tuple[str, str]
) -> None:
    """At the next UTC midnight the last read is yesterday's: it is read again at once (not
    REFRESH_S later), and when that read fails the day starts from nothing."""
    org = orgs[0]
    meter = _meter(store, Budgets(10))
    meter.count(org, Usage(6, 6))
    assert await meter.flush() == 1
    spent, renews = await meter.spent(org)
    assert spent == 12
    meter._reads[org].renews_at = time.monotonic() - 1  # the database's midnight passed
    meter.store = cast(Store, _Slowed(store, down=OSError("the database is away")))
    assert await meter.spent(org) == (0, renews + timedelta(days=1))


async def test_the_meter_forgets_the_organizations_whose_day_has_ended(
    store: Store, orgs: tuple[str, str]
) -> None:
    """A process keeps each organization's last read only until its day ends: one serving many
    organizations over days kept a read of every organization that ever called. A forgotten
    organization's next call reads the meter again, so nothing it spent today is lost."""
    org = orgs[0]
    meter = Meter(store, Budgets(100))
    yesterday = [f"{org}-{i}" for i in range(200)]
    for each in [*yesterday, org]:
        assert (await meter.spent(each))[0] == 0
    meter.count(org, Usage(6, 6))
    assert await meter.flush() == 1  # within PRUNE_S of the meter's start: nothing dropped
    assert len(meter._reads) == len(yesterday) + 1
    for each in yesterday:
        meter._reads[each].renews_at = time.monotonic() - 1  # their day has ended
    meter._reads[org].at -= REFRESH_S + 1  # idle since, but read today: kept
    meter._pruned_at = time.monotonic() - PRUNE_S  # its last sweep that long ago
    assert await meter.flush() == 0
    assert set(meter._reads) == {org}
    assert (await meter.spent(yesterday[0]))[0] == 0  # read again: nothing spent today
    assert (await meter.spent(org))[0] == 12


async def test_the_meter_sweeps_the_ended_days_at_most_once_a_prune_interval(
    store: Store, orgs: tuple[str, str]
) -> None:
    """The sweep walks every read the process holds: a flush (every 2 s) makes it only when
    PRUNE_S has passed since the last, and a sweep starts the next interval."""
    org = orgs[0]
    meter = Meter(store, Budgets(100))
    ended = [f"{org}-{i}" for i in range(3)]
    for each in ended:
        await meter.spent(each)
    for each in ended[:2]:
        meter._reads[each].renews_at = time.monotonic() - 1
    meter._pruned_at = time.monotonic() - PRUNE_S / 2  # half an interval since the last sweep
    await meter.flush()
    assert set(meter._reads) == set(ended)  # not yet
    meter._pruned_at = time.monotonic() - PRUNE_S
    await meter.flush()
    assert set(meter._reads) == {ended[2]}
    meter._reads[ended[2]].renews_at = time.monotonic() - 1
    await meter.flush()  # at once after a sweep: the next one waits its interval
    assert set(meter._reads) == {ended[2]}


async def test_an_admins_calls_are_not_counted(store: Store, orgs: tuple[str, str]) -> None:
    """An admin's job has no organization and no budget: its calls are not counted (a flush
    writes nothing for them)."""
    meter = Meter(store, Budgets(100))
    meter.count(None, Usage(5, 5))
    assert await meter.flush() == 0


async def test_counts_being_flushed_still_count_against_the_budget(
    store: Store, orgs: tuple[str, str]
) -> None:
    """A flush takes the process's counts to write them: until they are written (and added to
    the read), a call checked meanwhile still sees them, not a spend without them."""
    org = orgs[0]
    meter = _meter(store, Budgets(100))
    assert (await meter.spent(org))[0] == 0
    meter.count(org, Usage(40, 20))
    meter.store = cast(Store, _Slowed(store, delay_s=0.5))
    flushing = asyncio.create_task(meter.flush())
    await asyncio.sleep(0.1)  # the flush's write is on its way
    assert (await meter.spent(org))[0] == 60
    assert await flushing == 1
    assert (await meter.spent(org))[0] == 60


class _DatabaseAt:
    """A store whose meter reads answer the database's clock as `now` (its other answers are the
    real database's), counting the reads: a database 5 minutes before its UTC midnight."""

    def __init__(self, store: Store, now: datetime) -> None:
        self.store, self.now, self.reads = store, now, 0
        self.down: Exception | None = None

    async def fetch_one(self, name: str, params: dict[str, object]) -> object:
        if self.down is not None:
            raise self.down
        row = await self.store.fetch_one(name, params)
        if name != "token_usage_today":
            return row
        self.reads += 1
        assert row is not None
        return (row[0], self.now)

    async def fetch(self, name: str, params: dict[str, object]) -> object:
        return await self.store.fetch(name, params)


class _Refused:
    """The turn a refusal is for (`gateway_budget.Turn`)."""

    def __init__(self, organization_id: str) -> None:
        self.organization_id: str | None = organization_id
        self.until: datetime | None = None

    def met_quota(self, model: str, until: datetime) -> None:
        self.until = until


@pytest.mark.parametrize("skew_s", [300, -300])
async def test_a_process_clock_off_the_database_s_does_not_move_the_budget_day(
    store: Store, orgs: tuple[str, str], monkeypatch: pytest.MonkeyPatch, skew_s: int
) -> None:
    """The day renews at the database's UTC midnight, whatever this process's clock says: 5
    minutes before it (by the database), a worker whose clock is 5 minutes fast (past midnight
    already) or slow neither reads the meter at every call, nor tells the refused call to come
    back in 1 s (or in 10 minutes), nor, the database away, starts the new day early."""
    from activities import gateway_budget

    org = orgs[0]
    midnight = next_midnight() + timedelta(days=1)
    database_now = midnight - timedelta(minutes=5)
    real = datetime

    class Skewed(datetime):
        @classmethod
        def now(cls, tz: object = None) -> Skewed:
            at = database_now + timedelta(seconds=skew_s)
            return cls(*at.timetuple()[:6], tzinfo=UTC)

    assert real.now(UTC) < midnight
    database = _DatabaseAt(store, database_now)
    meter = Meter(cast(Store, database), Budgets(10))
    meter.count(org, Usage(6, 6))
    assert await meter.flush() == 1
    monkeypatch.setattr(gateway_budget, "datetime", Skewed)
    assert await meter.spent(org) == (12, midnight)
    for _ in range(20):  # within REFRESH_S: the last read stands
        assert await meter.spent(org) == (12, midnight)
    assert database.reads == 1
    grant = _Refused(org)
    refused = await meter.refusal(grant, "openai")
    assert refused is not None and grant.until == midnight
    assert abs(int(refused.headers["retry-after"]) - 300) <= 2
    database.down = OSError("the database is away")
    meter._reads[org].at -= REFRESH_S + 1  # stale: read again, which fails
    assert await meter.spent(org) == (12, midnight)
