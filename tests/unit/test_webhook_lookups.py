"""Webhook host lookups (activities/webhook_egress.py `_Lookups`): a tenant whose hosts' DNS
never answers holds a few lookup threads, not every organization's lookups. `getaddrinfo` is
replaced by a resolver that answers at once or never (until the test ends)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from activities import webhook_egress as egress
from receipts import metrics
from receipts.webhooks import WebhookSettings

PUBLIC = "93.184.215.14"


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Names under `blackholed.example` never resolve; any other resolves to PUBLIC. Counts the
    lookups made per name."""
    released = threading.Event()
    asked: Counter[str] = Counter()

    def getaddrinfo(host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        asked[host] += 1
        if host.endswith("blackholed.example"):
            released.wait(60)
            raise socket.gaierror("timed out")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (PUBLIC, port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(egress, "RESOLVE_TIMEOUT_S", 0.2)
    try:
        yield asked
    finally:
        released.set()
        # The next test starts with no lookup of this one's still running.
        for _ in range(100):
            if not egress._lookups._running:
                break
            time.sleep(0.05)


async def test_an_organizations_unanswered_hosts_do_not_starve_another_organizations(
    resolver: Counter[str],
) -> None:
    """Lookups ran on the event loop's default executor (6 threads on 2 cores, psycopg's
    connects among them), each keeping its thread long after its caller gave up: ten of one
    organization's hosts, tried again and again, took every thread, and every other
    organization's lookups timed out."""
    settings = WebhookSettings()
    refused_before = metrics.WEBHOOK_LOOKUPS_REFUSED._value.get()
    for _ in range(3):
        tries = [
            egress.check(f"https://h{i}.blackholed.example/", settings, "org-a") for i in range(10)
        ]
        answers = await asyncio.gather(*tries, return_exceptions=True)
        assert all(isinstance(a, egress.EgressRefused) for a in answers)
    # Each of org-a's hosts is looked up once at most however often it is tried, and no more
    # than LOOKUPS_PER_OWNER of them at a time: the rest are refused until one ends.
    assert sum(resolver.values()) == egress.LOOKUPS_PER_OWNER
    assert all(count == 1 for count in resolver.values())
    assert metrics.WEBHOOK_LOOKUPS_REFUSED._value.get() > refused_before
    # org-b's host, and org-b's own default loop work, are not held up.
    target = await egress.check("https://public.example/hook", settings, "org-b")
    assert target.address == PUBLIC
    assert await asyncio.get_running_loop().run_in_executor(None, lambda: "free") == "free"


async def test_a_lookup_beyond_the_organizations_share_says_why(resolver: Counter[str]) -> None:
    settings = WebhookSettings()
    held = [
        egress.check(f"https://s{i}.blackholed.example/", settings, "org-c")
        for i in range(egress.LOOKUPS_PER_OWNER)
    ]
    await asyncio.gather(*held, return_exceptions=True)
    with pytest.raises(egress.EgressRefused, match="still resolving"):
        await egress.check("https://one-more.blackholed.example/", settings, "org-c")
    # A host already being looked up is waited for, not refused (no new lookup).
    with pytest.raises(egress.EgressRefused, match="did not resolve within"):
        await egress.check("https://s0.blackholed.example/", settings, "org-c")
    assert resolver["s0.blackholed.example"] == 1


async def test_many_organizations_unanswered_hosts_do_not_starve_another_s(
    resolver: Counter[str],
) -> None:
    """All organizations' lookups shared one pool of 64 threads: 16 organizations whose hosts'
    DNS never answers (4 each, their share) took every thread, and every other organization's
    lookups queued behind them and timed out. Each lookup now has a thread of its own."""
    settings = WebhookSettings()
    tries = [
        egress.check(f"https://org-{n}-h{i}.blackholed.example/", settings, f"org-{n}")
        for n in range(20)
        for i in range(egress.LOOKUPS_PER_OWNER)
    ]
    answers = await asyncio.gather(*tries, return_exceptions=True)
    assert all(isinstance(a, egress.EgressRefused) for a in answers)
    assert sum(resolver.values()) == 80  # every one of them still resolving
    target = await egress.check("https://public.example/hook", settings, "org-b")
    assert target.address == PUBLIC


async def test_lookups_past_the_overall_cap_are_refused_and_say_why(
    resolver: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(egress, "MAX_LOOKUPS", 6)
    settings = WebhookSettings()
    held = [
        egress.check(f"https://c{n}-{i}.blackholed.example/", settings, f"org-c{n}")
        for n in range(3)
        for i in range(2)
    ]
    await asyncio.gather(*held, return_exceptions=True)
    with pytest.raises(egress.EgressRefused, match="6 webhook hosts are still resolving"):
        await egress.check("https://fresh.blackholed.example/", settings, "org-d")
    assert "fresh.blackholed.example" not in resolver


async def test_a_lookup_whose_thread_cannot_start_is_refused_and_leaves_nothing_behind(
    resolver: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process at its limit of threads (a container's pids limit: each lookup is a thread,
    up to MAX_LOOKUPS): the lookup is refused saying why, and the host is not left 'resolving'
    for good (a lookup no thread runs, that every later delivery to it waited on and timed
    out, and that held a place under MAX_LOOKUPS)."""
    settings = WebhookSettings()

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as patched:
        patched.setattr(threading.Thread, "start", no_thread)
        with pytest.raises(egress.EgressRefused, match="no thread"):
            await egress.check("https://public.example/hook", settings, "org-e")
    assert not egress._lookups._running
    target = await egress.check("https://public.example/hook", settings, "org-e")
    assert target.address == PUBLIC
