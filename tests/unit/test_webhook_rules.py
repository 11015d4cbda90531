"""Per-organization webhooks' pure rules: which addresses a webhook may reach, the retry
schedule (exponential backoff, full jitter, bounded), the secret's form and the create body."""

from __future__ import annotations

import base64
import random

import pytest

from activities.webhook_egress import refused_reason
from receipts import webhook_ids
from receipts.errors import InvalidInput
from receipts.webhooks import (
    EVENTS,
    WebhookSettings,
    gives_up,
    new_secret,
    parse_create,
    retry_delay_ms,
)


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.254", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("100.64.0.1", "CGNAT"),
        ("100.127.255.254", "CGNAT"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("fd12:3456::1", "unique-local"),
        ("fc00::1", "unique-local"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:10.0.0.1", "private"),
        ("240.0.0.1", "private"),  # reserved (Python counts it private)
        ("192.0.2.10", "private"),  # TEST-NET-1: documentation, never a receiver
        ("192.0.0.192", "reserved"),  # a cloud's metadata service, in the IETF's block
        ("2002:7f00:1::", "loopback"),  # 6to4 carrying 127.0.0.1
        ("2002:a9fe:a9fe::1", "link-local"),  # 6to4 carrying 169.254.169.254
        ("64:ff9b::a00:1", "private"),  # NAT64 of 10.0.0.1
        ("2001:0:4136:e378:8000:63bf:f5ff:fffe", "private"),  # Teredo, client 10.0.0.1
    ],
)
def test_addresses_a_webhook_may_not_reach(address: str, reason: str) -> None:
    assert refused_reason(address) == reason


@pytest.mark.parametrize(
    "address", ["93.184.215.14", "1.1.1.1", "172.32.0.1", "100.128.0.1", "2606:4700::1111"]
)
def test_public_addresses_are_allowed(address: str) -> None:
    assert refused_reason(address) is None


def test_the_backoff_doubles_up_to_its_cap_with_full_jitter() -> None:
    # The top of each try's range: base × 2^(tries-1), capped.
    top = random.Random()
    top.uniform = lambda a, b: b  # type: ignore[method-assign]
    assert [retry_delay_ms(t, 1_000, 30_000, top) for t in range(1, 8)] == [
        1_000,
        2_000,
        4_000,
        8_000,
        16_000,
        30_000,
        30_000,
    ]
    # Full jitter: anywhere from 0 to the top, not bunched at it.
    rng = random.Random(7)
    waits = [retry_delay_ms(4, 1_000, 30_000, rng) for _ in range(2_000)]
    assert 0 <= min(waits) < 400 and 7_600 < max(waits) <= 8_000
    assert 3_500 < sum(waits) / len(waits) < 4_500


def test_a_delivery_gives_up_at_its_tries_or_its_age() -> None:
    settings = WebhookSettings(max_tries=5, retry_for_ms=60_000)
    assert not gives_up(4, 59_999, settings)
    assert gives_up(5, 1, settings)
    assert gives_up(1, 60_000, settings)


def test_with_the_defaults_the_24_hour_window_ends_a_delivery_not_its_tries() -> None:
    """25 tries of full-jitter backoff capped at 1 h took about 8 h: "25 tries or 24 h" gave up
    on an endpoint down overnight. The default tries outlast the window in 98 of 100 runs."""
    settings = WebhookSettings()
    rng = random.Random(7)
    spans = []
    for _ in range(400):
        waits = (
            retry_delay_ms(n, settings.retry_base_ms, settings.retry_max_ms, rng)
            for n in range(1, settings.max_tries)
        )
        spans.append(sum(waits))
    outlast = sum(span >= settings.retry_for_ms for span in spans)
    assert outlast >= 0.98 * len(spans), outlast


def test_a_secret_is_whsec_and_24_or_more_random_bytes() -> None:
    one, two = new_secret(), new_secret()
    assert one != two and one.startswith("whsec_")
    assert len(base64.b64decode(one.removeprefix("whsec_"))) >= 24


def test_settings_read_the_allow_list() -> None:
    settings = WebhookSettings.load({"RECEIPT_WEBHOOK_ALLOWED_HOSTS": " Hooks.Internal, [::1] ,"})
    assert settings.hosts == frozenset({"hooks.internal", "::1"})


@pytest.mark.parametrize(
    ("body", "field", "allowed"),
    [
        ({"url": "https://x.example/h", "events": ["job.done"]}, "events[0]", EVENTS),
        ({"url": "https://x.example/h", "events": []}, "events", EVENTS),
        ({"url": "https://x.example/h"}, "events", EVENTS),
        ({"url": "ftp://x.example/h", "events": ["job.failed"]}, "url", ("https", "http")),
        ({"url": "https://u:p@x.example/h", "events": ["job.failed"]}, "url", None),
        ({"url": "https://x.example/" + "a" * 2_000, "events": ["job.failed"]}, "url", None),
        ({"url": "https://x.example/h", "events": ["job.failed"], "secret": "s"}, "secret", None),
        (
            {"url": "https://x.example/h", "events": ["job.failed"], "description": 5},
            "description",
            None,
        ),
    ],
)
def test_a_bad_create_body_names_its_field(
    body: dict[str, object], field: str, allowed: tuple[str, ...] | None
) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_create(body)
    assert refused.value.field == field
    if allowed is not None:
        assert refused.value.allowed == list(allowed)


def test_a_good_create_body_keeps_each_event_once() -> None:
    parsed = parse_create(
        {"url": "https://x.example/h", "events": ["job.failed", "job.failed", "session.wakeup"]}
    )
    assert parsed.events == ["job.failed", "session.wakeup"] and parsed.description is None


def test_a_delivery_id_is_shown_permuted_by_its_webhooks_key_and_read_back() -> None:
    ids = [0, 1, 2, 3, 1_000, webhook_ids.LIMIT - 1, *random.sample(range(webhook_ids.LIMIT), 200)]
    for key in ("one-key", "another-key"):
        shown = [webhook_ids.shown(key, i) for i in ids]
        assert [webhook_ids.stored(key, s) for s in shown] == ids
        assert len(set(shown)) == len(ids)
    # Consecutive ids are not shown consecutive, and two webhooks show one id differently.
    gaps = {webhook_ids.shown("k", i + 1) - webhook_ids.shown("k", i) for i in range(20)}
    assert gaps != {1}
    # Nor is either half of a shown id the count in clear (one round would show it on top).
    halves = [divmod(webhook_ids.shown("k", i), 1 << 31) for i in range(20)]
    for half in (0, 1):
        assert {halves[i + 1][half] - halves[i][half] for i in range(19)} != {1}
    assert webhook_ids.shown("one-key", 7) != webhook_ids.shown("another-key", 7)
    for outside in (-1, webhook_ids.LIMIT):
        with pytest.raises(ValueError):
            webhook_ids.shown("k", outside)
        with pytest.raises(ValueError):
            webhook_ids.stored("k", outside)
