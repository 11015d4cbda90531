"""Per-organization webhooks against real PostgreSQL and a real HTTP receiver on 127.0.0.1:
subscriptions through the API, deliveries owed in the settle's own statement, posted signed
(verified with the `standardwebhooks` package), retried after a 500, never across
organizations, and the egress rules at create and at each delivery."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import ssl
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from standardwebhooks.webhooks import Webhook as Verifier
from standardwebhooks.webhooks import WebhookVerificationError

from activities import webhook_egress as egress
from activities.webhook_egress import Target, post
from receipt_client import Client
from receipt_client.errors import InvalidInput as ClientInvalidInput
from receipt_client.errors import NotFound
from receipts import metrics, retention, webhook_ids, webhook_tries
from receipts import operations as ops
from receipts import webhooks as hooks
from receipts.agent_jobs import lifecycle
from receipts.agent_jobs.lifecycle import CreateRequest
from receipts.agent_jobs.registry import AgentJobSettings
from receipts.guarded import append_if_unchanged
from receipts.objectives import store as objectives
from receipts.sql import query
from receipts.store import Draft, Store
from receipts.tenancy import HIDDEN_POSITION, caller_id
from receipts.webhooks import WebhookSettings
from roles.delivery.agent_jobs import AgentJobDispatcher
from roles.delivery.webhooks import WebhookDeliverer
from tests.eventually import eventually
from tests.integration.api_support import AS_A, AS_ADMIN, AS_B, TOKEN_A, api_client, running_api
from tests.integration.helpers import create_objective, new_id, put

LEASE = 60_000
# The receiver listens on loopback over plain http: the operator's allow-list admits it.
ALLOWED = WebhookSettings(
    allowed_hosts="127.0.0.1", retry_base_ms=200, retry_max_ms=400, poll_interval_ms=50
)


@dataclass
class Post:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed


@dataclass
class Receiver:
    """An HTTP server on 127.0.0.1: records every POST per path and answers each path with the
    statuses queued for it (200 once they run out)."""

    posts: list[Post] = field(default_factory=list)
    statuses: dict[str, list[int]] = field(default_factory=dict)
    port: int = 0
    # Paths whose posts get no answer until this is set (a dead endpoint).
    hang: set[str] = field(default_factory=set)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    # Paths whose answers carry this Location header (a redirect).
    location: dict[str, str] = field(default_factory=dict)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def at(self, path: str) -> list[Post]:
        return [p for p in self.posts if p.path == path]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = (await reader.readline()).decode().split()
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        path = request[1]
        self.posts.append(Post(path, headers, body))
        if path in self.hang:
            await self.release.wait()
        queued = self.statuses.get(path, [])
        status = queued.pop(0) if queued else 200
        moved = f"Location: {self.location[path]}\r\n" if path in self.location else ""
        writer.write(
            f"HTTP/1.1 {status} X\r\n{moved}Content-Length: 0\r\nConnection: close\r\n\r\n".encode()
        )
        await writer.drain()
        writer.close()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    found = Receiver()
    server = await asyncio.start_server(found.handle, "127.0.0.1", 0)
    found.port = server.sockets[0].getsockname()[1]
    yield found
    server.close()
    await server.wait_closed()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


async def subscribe(
    api: httpx.AsyncClient, headers: dict[str, str], url: str, events: list[str]
) -> tuple[str, str]:
    answer = await api.post("/webhooks", json={"url": url, "events": events}, headers=headers)
    assert answer.status_code == 201, answer.text
    created = answer.json()
    assert created["secret"].startswith("whsec_")
    return created["webhook"]["webhookId"], created["secret"]


async def running(store: Store, org: str = "org-a") -> str:
    job = (await put(store, org=org, maxAttempts=1)).job
    assert job.organization_id == org
    out = await ops.start_attempt(store, job.job_id, attempt=1, worker_id="w1", lease_ms=LEASE)
    assert out.ok
    return job.job_id


async def completed(store: Store, org: str = "org-a") -> str:
    job_id = await running(store, org)
    assert (await ops.complete(store, job_id, worker_id="w1", attempt=1, result={"ok": 1})).ok
    return job_id


async def owed(store: Store, job_id: str) -> int:
    async with store.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM webhook_deliveries WHERE subject = %s", (job_id,)
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


def verify(post: Post, secret: str) -> dict[str, Any]:
    verified: dict[str, Any] = Verifier(secret).verify(post.body, post.headers)
    return verified


async def test_a_receiver_gets_exactly_its_organizations_subscribed_events_signed(
    fresh: tuple[Store, str], receiver: Receiver, http: httpx.AsyncClient
) -> None:
    store, url = fresh
    async with api_client(url, store=store, webhooks=ALLOWED) as api:
        _, secret_a = await subscribe(
            api, AS_A, receiver.url("/a"), ["job.completed", "job.failed"]
        )
        _, secret_b = await subscribe(api, AS_B, receiver.url("/b"), ["job.completed"])
    done_a = await completed(store, "org-a")
    failed_a = await running(store, "org-a")
    assert (
        await ops.fail(store, failed_a, worker_id="w1", attempt=1, error="boom", retryable=False)
    ).ok
    canceled_a = (await put(store, org="org-a")).job.job_id  # canceled: not subscribed
    assert (await ops.cancel_queued(store, canceled_a, reason="no")).ok
    done_b = await completed(store, "org-b")
    before = metrics.value(
        "receipt_webhook_deliveries_total", event="job.completed", outcome="delivered"
    )

    deliverer = WebhookDeliverer(store, ALLOWED, http)
    result = await deliverer.run_once()
    assert (result.claimed, result.delivered) == (3, 3)
    assert (await deliverer.run_once()).claimed == 0  # delivered once

    got_a = {
        (b["type"], b["data"]["job"]["jobId"])
        for b in map(lambda p: verify(p, secret_a), receiver.at("/a"))
    }
    assert got_a == {("job.completed", caller_id(done_a)), ("job.failed", caller_id(failed_a))}
    got_b = [verify(p, secret_b) for p in receiver.at("/b")]
    assert [(b["type"], b["data"]["job"]["jobId"]) for b in got_b] == [
        ("job.completed", caller_id(done_b))
    ]
    # Neither receiver's secret verifies the other organization's posts, and no body carries
    # the other organization's job.
    for sent in receiver.at("/b"):
        with pytest.raises(WebhookVerificationError):
            verify(sent, secret_a)
    assert all(caller_id(done_b) not in p.body.decode() for p in receiver.at("/a"))
    assert len(receiver.posts) == 3
    after = metrics.value(
        "receipt_webhook_deliveries_total", event="job.completed", outcome="delivered"
    )
    assert after - before == 2


async def test_a_500_is_retried_with_the_same_id_and_the_deliveries_show_it(
    fresh: tuple[Store, str], receiver: Receiver, http: httpx.AsyncClient
) -> None:
    store, url = fresh
    receiver.statuses["/flaky"] = [500]
    async with api_client(url, store=store, webhooks=ALLOWED) as api:
        hook, secret = await subscribe(api, AS_A, receiver.url("/flaky"), ["job.completed"])
        job_id = await completed(store)
        deliverer = WebhookDeliverer(store, ALLOWED, http)
        assert (await deliverer.run_once()).retried == 1

        shown = (await api.get(f"/webhooks/{hook}/deliveries", headers=AS_A)).json()
        [delivery] = shown["deliveries"]
        assert delivery["status"] == "pending" and delivery["tries"] == 1
        assert delivery["lastStatusCode"] == 500 and delivery["nextTryAt"] is not None
        assert delivery["subject"] == caller_id(job_id)  # the organization's own id
        assert delivery["attempts"][0]["statusCode"] == 500

        deadline = time.monotonic() + 10
        while (await deliverer.run_once()).delivered == 0:
            assert time.monotonic() < deadline, "the retry never came"
            await asyncio.sleep(0.05)
        [delivery] = (await api.get(f"/webhooks/{hook}/deliveries", headers=AS_A)).json()[
            "deliveries"
        ]
        assert delivery["status"] == "delivered" and delivery["tries"] == 2
        assert delivery["nextTryAt"] is None and delivery["lastStatusCode"] == 200
    first, second = receiver.at("/flaky")
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    # The body's timestamp is when the event was owed, not when it was tried: the same bytes.
    assert first.body == second.body
    assert verify(second, secret)["data"]["job"]["status"] == "completed"


async def test_a_redirect_is_a_failed_try_and_is_not_followed(
    fresh: tuple[Store, str], receiver: Receiver, http: httpx.AsyncClient
) -> None:
    """README: "A 2xx answer is delivered; a redirect is not followed": a 302 is a failed try
    (tried again later), and the URL it names gets nothing."""
    store, url = fresh
    receiver.statuses["/moved"] = [302]
    receiver.location["/moved"] = receiver.url("/elsewhere")
    async with api_client(url, store=store, webhooks=ALLOWED) as api:
        hook, _ = await subscribe(api, AS_A, receiver.url("/moved"), ["job.completed"])
        await completed(store)
        outcome = await WebhookDeliverer(store, ALLOWED, http).run_once()
        [delivery] = (await api.get(f"/webhooks/{hook}/deliveries", headers=AS_A)).json()[
            "deliveries"
        ]
    assert (outcome.retried, outcome.delivered) == (1, 0)
    assert delivery["status"] == "pending" and delivery["lastStatusCode"] == 302
    assert len(receiver.at("/moved")) == 1 and receiver.at("/elsewhere") == []


async def test_create_and_rotate_need_jobs_read_beside_jobs_write(
    fresh: tuple[Store, str], receiver: Receiver
) -> None:
    """README: create and rotate need `jobs:read` and `jobs:write` (a subscription receives the
    organization's job results): a token that may only write gets neither a subscription nor
    a secret."""
    store, url = fresh
    writer = "token-org-a-writer-0123456789"
    as_writer = {"Authorization": f"Bearer {writer}"}
    tokens = f"{TOKEN_A} org-a\n{writer} org-a jobs:write"
    async with api_client(url, store=store, webhooks=ALLOWED, tokens=tokens) as api:
        hook, _ = await subscribe(api, AS_A, receiver.url("/a"), ["job.completed"])
        body = {"url": receiver.url("/w"), "events": ["job.completed"]}
        created = await api.post("/webhooks", json=body, headers=as_writer)
        assert created.status_code == 403 and "jobs:read" in created.text, created.text
        rotated = await api.post(f"/webhooks/{hook}/rotate-secret", headers=as_writer)
        assert rotated.status_code == 403 and "jobs:read" in rotated.text, rotated.text
        assert [
            w["webhookId"] for w in (await api.get("/webhooks", headers=AS_A)).json()["webhooks"]
        ] == [hook]


async def test_each_test_post_takes_one_of_the_organizations_enqueue_tokens(
    fresh: tuple[Store, str], receiver: Receiver
) -> None:
    """`POST /webhooks/{id}/test` is work for the deliverer as a job is: each takes one of the
    organization's enqueue tokens (429 past them, as its API document says), so a tenant cannot
    fill the outbox with tests."""
    store, url = fresh
    async with api_client(
        url, store=store, webhooks=ALLOWED, org_enqueue_rate=1e-6, org_enqueue_burst=1
    ) as api:
        hook, _ = await subscribe(api, AS_A, receiver.url("/t"), ["job.completed"])
        assert (await api.post(f"/webhooks/{hook}/test", headers=AS_A)).status_code == 202
        refused = await api.post(f"/webhooks/{hook}/test", headers=AS_A)
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    async with store.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM webhook_deliveries")
        assert await cur.fetchone() == (1,)


async def test_a_jobs_event_shows_its_task_env_redacted(
    fresh: tuple[Store, str], receiver: Receiver, http: httpx.AsyncClient
) -> None:
    """README: the body holds the job as `GET /jobs/{id}` shows it, `task.env` redacted: a
    value a caller passed to its command's environment never reaches a receiver."""
    store, url = fresh
    async with api_client(url, store=store, webhooks=ALLOWED) as api:
        _, secret = await subscribe(api, AS_A, receiver.url("/env"), ["job.completed"])
    task = {"command": ["true"], "env": {"API_KEY": "s3cr3t-value"}}
    job = (await put(store, org="org-a", maxAttempts=1, payload_extra={"task": task})).job
    assert (
        await ops.start_attempt(store, job.job_id, attempt=1, worker_id="w1", lease_ms=LEASE)
    ).ok
    assert (await ops.complete(store, job.job_id, worker_id="w1", attempt=1)).ok
    assert (await WebhookDeliverer(store, ALLOWED, http).run_once()).delivered == 1
    [sent] = receiver.at("/env")
    assert b"s3cr3t-value" not in sent.body
    shown = verify(sent, secret)["data"]["job"]["payload"]["task"]["env"]
    assert set(shown) == {"API_KEY"}


async def test_a_delivery_gives_up_after_its_tries(
    fresh: tuple[Store, str], receiver: Receiver, http: httpx.AsyncClient
) -> None:
    store, url = fresh
    settings = ALLOWED.model_copy(update={"max_tries": 2, "retry_base_ms": 1, "retry_max_ms": 1})
    receiver.statuses["/dead"] = [503, 503, 503]
    async with api_client(url, store=store, webhooks=settings) as api:
        hook, _ = await subscribe(api, AS_A, receiver.url("/dead"), ["job.completed"])
        await completed(store)
        deliverer = WebhookDeliverer(store, settings, http)
        assert (await deliverer.run_once()).retried == 1
        await asyncio.sleep(0.05)
        assert (await deliverer.run_once()).failed == 1
        [delivery] = (await api.get(f"/webhooks/{hook}/deliveries", headers=AS_A)).json()[
            "deliveries"
        ]
    assert delivery["status"] == "failed" and delivery["tries"] == 2
    assert [a["statusCode"] for a in delivery["attempts"]] == [503, 503]
    assert (await deliverer.run_once()).claimed == 0
    assert len(receiver.at("/dead")) == 2


async def test_a_delivery_owed_past_its_window_is_failed_unposted(
    fresh: tuple[Store, str], receiver: Receiver, http: httpx.AsyncClient
) -> None:
    """A delivery that waited past RECEIPT_WEBHOOK_RETRY_FOR_MS (behind its organization's
    backlog at a dead endpoint) was still posted, days late, and kept its job from retention
    until then. It is failed without a post."""
    store, url = fresh
    async with api_client(url, store=store, webhooks=ALLOWED) as api:
        hook, _ = await subscribe(api, AS_A, receiver.url("/late"), ["job.completed"])
        await completed(store)
        async with store.connection() as conn:
            await conn.execute(
                "UPDATE webhook_deliveries SET created_at = now() - interval '25 hours'"
            )
        assert (await WebhookDeliverer(store, ALLOWED, http).run_once()).failed == 1
        [delivery] = (await api.get(f"/webhooks/{hook}/deliveries", headers=AS_A)).json()[
            "deliveries"
        ]
    assert delivery["status"] == "failed"
    assert delivery["lastError"].startswith("expired: not delivered within")
    assert receiver.at("/late") == []


async def test_the_try_the_window_ends_on_is_posted_not_expired(
    fresh: tuple[Store, str],
    receiver: Receiver,
    http: httpx.AsyncClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The backoff cuts the last wait to end at the retry window: that try was then claimed a
    moment past the window and failed unposted as `expired` (meant for a delivery that waited
    behind a backlog), losing the try and its real answer (99.75 % of deliveries to a dead
    endpoint, with the defaults). It is posted, and its answer recorded."""
    # The jitter's ceiling, always: a full-jitter wait shorter than what is left of the window
    # (about 2 % of draws here) made a third try inside it, and the count below 3.
    monkeypatch.setattr(
        hooks, "retry_delay_ms", lambda tries, base, most, rng=None: min(most, base * 2**tries)
    )
    store, url = fresh
    settings = ALLOWED.model_copy(
        update={"retry_for_ms": 1_500, "retry_base_ms": 60_000, "retry_max_ms": 60_000}
    )
    receiver.statuses["/dead"] = [503, 503, 503]
    async with api_client(url, store=store, webhooks=settings) as api:
        hook, _ = await subscribe(api, AS_A, receiver.url("/dead"), ["job.completed"])
        await completed(store)
        deliverer = WebhookDeliverer(store, settings, http)
        deadline = time.monotonic() + 15
        while True:
            page = await api.get(f"/webhooks/{hook}/deliveries", headers=AS_A)
            [delivery] = page.json()["deliveries"]
            if delivery["status"] != "pending":
                break
            assert time.monotonic() < deadline, delivery
            await deliverer.run_once()
            await asyncio.sleep(0.05)
    assert len(receiver.at("/dead")) == 2
    assert (delivery["status"], delivery["lastStatusCode"], delivery["lastError"]) == (
        "failed",
        503,
        "HTTP 503",
    )


async def test_a_receiver_cannot_make_each_recorded_try_kilobytes_long(
    fresh: tuple[Store, str], http: httpx.AsyncClient
) -> None:
    """A try's error is the exception's text, which a receiver writes: an answer whose head is
    one 15 KB bad line was recorded whole, twice a try (`lastError` and its entry in
    `attempts`), 70 tries a delivery, 200 deliveries a page."""

    async def bad_head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        writer.write(b"HTTP/1.1 500 x\r\n" + b"X" * 15_000 + b"\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(bad_head, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    store, url = fresh
    settings = ALLOWED.model_copy(update={"retry_base_ms": 1, "retry_max_ms": 1})
    try:
        async with api_client(url, store=store, webhooks=settings) as api:
            hook, _ = await subscribe(api, AS_A, f"http://127.0.0.1:{port}/h", ["job.completed"])
            await completed(store)
            deliverer = WebhookDeliverer(store, settings, http)
            for _ in range(3):
                await deliverer.run_once()
                await asyncio.sleep(0.02)
            answer = await api.get(f"/webhooks/{hook}/deliveries", headers=AS_A)
    finally:
        server.close()
    [delivery] = answer.json()["deliveries"]
    assert delivery["tries"] >= 2
    assert len(delivery["lastError"]) <= hooks.MAX_ERROR_CHARS
    assert all(len(a["error"] or "") <= hooks.MAX_ERROR_CHARS for a in delivery["attempts"])


async def test_a_try_that_could_not_be_recorded_is_counted(
    fresh: tuple[Store, str],
    receiver: Receiver,
    http: httpx.AsyncClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every try is counted in `receipt_webhook_deliveries_total` (README), but one whose record
    failed (the database away) was only logged: a deliverer posting while nothing was recorded
    showed nothing in the metric. It is counted `lapsed`."""
    store, url = fresh
    async with api_client(url, store=store, webhooks=ALLOWED) as api:
        await subscribe(api, AS_A, receiver.url("/x"), ["job.completed"])
        await completed(store)

    async def unrecorded(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the database is away")

    monkeypatch.setattr(webhook_tries, "record_try", unrecorded)
    lapsed = metrics.WEBHOOK_DELIVERIES.labels("job.completed", "lapsed")
    before = lapsed._value.get()
    assert (await WebhookDeliverer(store, ALLOWED, http).run_once()).lapsed == 1
    assert len(receiver.at("/x")) == 1  # posted, not recorded
    assert lapsed._value.get() - before == 1


async def test_a_try_that_outlived_its_claim_records_nothing_over_the_next_claim(
    fresh: tuple[Store, str], receiver: Receiver, http: httpx.AsyncClient
) -> None:
    """A try's record cleared whatever claim the delivery had: a try that outlived its claim (a
    stalled loop) while another deliverer took the delivery marked it delivered and unclaimed
    under that deliverer's feet, which then claimed it again. The claim is the record's fence:
    the late try is counted `superseded` and writes nothing; the holder's try is recorded."""
    store, url = fresh
    async with api_client(url, store=store, webhooks=ALLOWED) as api:
        hook, _ = await subscribe(api, AS_A, receiver.url("/slow"), ["job.completed"])
        await completed(store)
    receiver.hang.add("/slow")
    superseded = metrics.WEBHOOK_DELIVERIES.labels("job.completed", "superseded")
    before = superseded._value.get()
    first = asyncio.create_task(WebhookDeliverer(store, ALLOWED, http).run_once())

    async def posts() -> int:
        return len(receiver.at("/slow"))

    await eventually(posts, lambda n: n == 1, what="the first try posted")
    async with store.connection() as conn:  # the first claim lapses; another deliverer claims
        await conn.execute(
            "UPDATE webhook_deliveries SET claimed_until = now(), next_try_at = now() "
            "WHERE webhook_id = %s",
            (hook,),
        )
    [second] = await hooks.claim(store, limit=1, per_org=4, lease_ms=25_000)
    receiver.release.set()
    assert (await first).superseded == 1
    assert superseded._value.get() - before == 1
    async with store.connection() as conn:
        cur = await conn.execute(
            "SELECT status, tries, claimed_until, attempts FROM webhook_deliveries "
            "WHERE webhook_id = %s",
            (hook,),
        )
        assert await cur.fetchone() == ("pending", 0, second.claimed_until, [])
    recorded = await webhook_tries.record_try(
        store, second, status="delivered", status_code=200, error=None, duration_ms=3
    )
    assert recorded is not None


def plan_nodes(plan: dict[str, Any]) -> list[tuple[str, str | None, str | None]]:
    """(node type, relation, index) of every node of an EXPLAIN (FORMAT JSON) plan."""
    nodes = [(plan["Node Type"], plan.get("Relation Name"), plan.get("Index Name"))]
    for child in plan.get("Plans", []):
        nodes += plan_nodes(child)
    return nodes


async def test_a_claim_counts_in_flight_deliveries_without_reading_a_backlog(
    fresh: tuple[Store, str],
) -> None:
    """The claim counts each organization's deliveries in flight: with no index on
    `claimed_until` it read every pending delivery of an organization with a backlog (a day of
    them at a dead endpoint: 112–152 ms a claim at 200 000, every second on every driver, under
    the claim's one lock). It reads the small index of claimed rows."""
    _, url = fresh
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO webhooks (webhook_id, organization_id, url, events, secret) "
            "VALUES ('wh-backlog', 'org-a', 'https://example.com/', '{job.completed}', 's')"
        )
        conn.execute(
            "INSERT INTO webhook_deliveries (webhook_id, organization_id, event, event_key, "
            "subject, next_try_at, claimed_until) "
            "SELECT 'wh-backlog', 'org-a', 'job.completed', 'j' || i, 'j' || i, "
            "now() + interval '1 hour', CASE WHEN i % 10000 = 0 THEN now() END "
            "FROM generate_series(1, 60000) AS i"
        )
        conn.execute("VACUUM ANALYZE webhook_deliveries")
        conn.execute("SET jit = off")
        row = conn.execute(
            b"EXPLAIN (FORMAT JSON) " + query("webhook_deliveries_claim").encode(),
            {"per_org": 4, "limit": 50, "lease_ms": 25_000},
        ).fetchone()
    assert row is not None
    nodes = plan_nodes(row[0][0]["Plan"])
    assert not [n for n in nodes if n[1] == "webhook_deliveries" and "Seq Scan" in n[0]], nodes
    assert any(n[2] == "webhook_deliveries_claimed_idx" for n in nodes), nodes


async def test_a_refused_settle_writes_no_delivery_row(
    fresh: tuple[Store, str], receiver: Receiver
) -> None:
    store, url = fresh
    async with api_client(url, store=store, webhooks=ALLOWED) as api:
        await subscribe(api, AS_A, receiver.url("/a"), ["job.completed"])
    # The guarded statement: another append lands between the read and the settle.
    job_id = await running(store)
    job, now = await store.get_job_with_now(job_id)
    assert job is not None
    assert (await ops.progress(store, job_id, worker_id="w1", attempt=1, data={"p": 1})).ok
    fence = {"workerId": "w1", "attempt": 1, "settlementId": "w1"}
    settle = [Draft("job.completed", {**fence, "result": None})]
    assert await append_if_unchanged(store, job_id, job, settle, now, lease_held=True) is None
    assert await owed(store, job_id) == 0
    # The locked transaction: the settle rolled back, its delivery with it.
    with pytest.raises(RuntimeError):
        async with store.transaction() as tx:
            locked = await tx.job_for_update(job_id)
            await tx.append_job(job_id, locked, settle)
            assert await tx.fetch("count_webhook_deliveries", {"job_ids": [job_id]}) == [(1,)]
            raise RuntimeError("rolled back")
    assert await owed(store, job_id) == 0
    # The settle that lands owes exactly one.
    assert (await ops.complete(store, job_id, worker_id="w1", attempt=1)).ok
    assert await owed(store, job_id) == 1
    # A job of an organization without webhooks owes nothing.
    assert await owed(store, await completed(store, "org-b")) == 0


ACTIONS = ("created", "tested", "secret_rotated", "deleted")


async def test_rotating_the_secret_makes_the_old_one_fail_the_next_delivery(
    fresh: tuple[Store, str],
    receiver: Receiver,
    http: httpx.AsyncClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, url = fresh
    caplog.set_level("INFO", logger="roles.api.webhooks")
    changes = {a: metrics.value("receipt_webhook_changes_total", action=a) for a in ACTIONS}
    async with api_client(url, store=store, webhooks=ALLOWED) as api:
        hook, old = await subscribe(api, AS_A, receiver.url("/r?token=t0ken"), ["job.completed"])
        tested = await api.post(f"/webhooks/{hook}/test", headers=AS_A)
        assert tested.status_code == 202
        rotated = await api.post(f"/webhooks/{hook}/rotate-secret", headers=AS_A)
        assert rotated.status_code == 200
        new = rotated.json()["secret"]
        assert new != old and rotated.json()["webhook"]["secretRotatedAt"] is not None
        assert "secret" not in (await api.get(f"/webhooks/{hook}", headers=AS_A)).json()
        await WebhookDeliverer(store, ALLOWED, http).run_once()
        assert (await api.delete(f"/webhooks/{hook}", headers=AS_A)).status_code == 204
    # Where an organization's events go, and when its secret changed, leave a trace (no secret,
    # no URL beyond its host: a receiver's URL may carry its own token).
    for action in ACTIONS:
        assert metrics.value("receipt_webhook_changes_total", action=action) == changes[action] + 1
    logged = [r.__dict__ for r in caplog.records]
    logged = [r for r in logged if str(r.get("event", "")).startswith("webhook.")]
    assert [r["event"] for r in logged][:4] == [f"webhook.{a}" for a in ACTIONS]
    assert all(r["webhookId"] == hook for r in logged[:4])
    assert "t0ken" not in caplog.text and new not in caplog.text and old not in caplog.text
    [post] = receiver.at("/r?token=t0ken")
    assert verify(post, new)["type"] == "webhook.test"
    assert verify(post, new)["data"]["webhookId"] == hook
    with pytest.raises(WebhookVerificationError):
        verify(post, old)


async def test_delivery_ids_say_nothing_of_other_organizations_deliveries(
    fresh: tuple[Store, str], receiver: Receiver
) -> None:
    # Delivery ids come from one sequence for every organization: shown as they are, the gap
    # between two of org-b's would count the deliveries owed to org-a's webhooks meanwhile.
    store, url = fresh
    async with api_client(url, store=store, webhooks=ALLOWED) as api:
        ours, _ = await subscribe(api, AS_B, receiver.url("/b"), ["job.failed"])
        theirs, _ = await subscribe(api, AS_A, receiver.url("/a"), ["job.failed"])

        async def tested(hook: str, headers: dict[str, str]) -> str:
            answer = await api.post(f"/webhooks/{hook}/test", headers=headers)
            assert answer.status_code == 202, answer.text
            delivery: str = answer.json()["deliveryId"]
            return delivery

        first, quiet = await tested(ours, AS_B), await tested(ours, AS_B)
        for _ in range(3):
            await tested(theirs, AS_A)
        busy = await tested(ours, AS_B)
        listed = await api.get(f"/webhooks/{ours}/deliveries", headers=AS_B)
        assert [d["deliveryId"] for d in listed.json()["deliveries"]] == [busy, quiet, first]
    # What org-b is shown is not the sequence: no gap counts org-a's three.
    assert int(busy) - int(quiet) != 4 or int(quiet) - int(first) != 1


async def test_another_organization_sees_nothing_and_bad_input_writes_nothing(
    fresh: tuple[Store, str], receiver: Receiver
) -> None:
    store, url = fresh
    capped = ALLOWED.model_copy(update={"max_per_organization": 2})
    async with api_client(url, store=store, webhooks=capped) as api:
        hook, _ = await subscribe(api, AS_A, receiver.url("/a"), ["job.failed"])
        for method, path in [
            ("GET", f"/webhooks/{hook}"),
            ("DELETE", f"/webhooks/{hook}"),
            ("POST", f"/webhooks/{hook}/rotate-secret"),
            ("POST", f"/webhooks/{hook}/test"),
            ("GET", f"/webhooks/{hook}/deliveries"),
        ]:
            answer = await api.request(method, path, headers=AS_B)
            assert answer.status_code == 404, (method, path)
            assert answer.json()["error"]["field"] == "webhookId"
        assert (await api.get("/webhooks", headers=AS_B)).json()["webhooks"] == []
        assert [
            w["webhookId"]
            for w in (await api.get("/webhooks", headers=AS_ADMIN)).json()["webhooks"]
        ] == [hook]

        bad = await api.post(
            "/webhooks", json={"url": receiver.url("/a"), "events": ["job.done"]}, headers=AS_A
        )
        assert bad.status_code == 422
        assert bad.json()["error"]["field"] == "events[0]"
        assert "objective.settled" in bad.json()["error"]["allowed"]

        await subscribe(api, AS_A, receiver.url("/a2"), ["job.failed"])
        third = await api.post(
            "/webhooks", json={"url": receiver.url("/a3"), "events": ["job.failed"]}, headers=AS_A
        )
        assert third.status_code == 409 and third.json()["error"]["code"] == "too_many_webhooks"
        page = (await api.get("/webhooks?limit=1", headers=AS_A)).json()
        assert len(page["webhooks"]) == 1 and page["nextCursor"]
        rest = (
            await api.get(f"/webhooks?limit=1&cursor={page['nextCursor']}", headers=AS_A)
        ).json()
        assert len(rest["webhooks"]) == 1 and rest["nextCursor"] is None
        assert {page["webhooks"][0]["webhookId"], rest["webhooks"][0]["webhookId"]} >= {hook}

        assert (await api.delete(f"/webhooks/{hook}", headers=AS_A)).status_code == 204
        assert (await api.get(f"/webhooks/{hook}", headers=AS_A)).status_code == 404


async def test_a_deliveries_cursor_this_api_did_not_return_is_422_not_a_500(
    fresh: tuple[Store, str], receiver: Receiver
) -> None:
    """The deliveries' cursor names a delivery id as shown (receipts/webhook_ids.py): `²`
    passes `str.isdigit` (int() refused it) and 20 digits passed PostgreSQL's bigint (out of
    range): both were a 500."""
    store, url = fresh
    async with api_client(url, store=store, webhooks=ALLOWED) as api:
        hook, _ = await subscribe(api, AS_A, receiver.url("/c"), ["job.failed"])
        for key in ("\u00b2", "9" * 20, "9223372036854775808", str(webhook_ids.LIMIT), "-1", " 1"):
            raw = json.dumps(["2026-01-01T00:00:00+00:00", key]).encode()
            cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
            answer = await api.get(f"/webhooks/{hook}/deliveries?cursor={cursor}", headers=AS_A)
            assert answer.status_code == 422, (key, answer.text)
            assert answer.json()["error"]["field"] == "cursor"
        raw = json.dumps(["2026-01-01T00:00:00+00:00", str(webhook_ids.LIMIT - 1)]).encode()
        cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
        answer = await api.get(f"/webhooks/{hook}/deliveries?cursor={cursor}", headers=AS_A)
        assert answer.status_code == 200 and answer.json()["deliveries"] == []


async def test_a_page_of_deliveries_ends_at_the_response_budget(
    fresh: tuple[Store, str], receiver: Receiver
) -> None:
    """Each delivery keeps all its tries (70, each with up to 500 characters of the receiver's
    error): a page of 200 failed ones was 8.3 MB, past RECEIPT_MAX_RESPONSE_BYTES (4 MiB). The
    page ends at the budget and its cursor reaches every delivery."""
    store, url = fresh
    async with api_client(url, store=store, webhooks=ALLOWED) as api:
        hook, _ = await subscribe(api, AS_A, receiver.url("/big"), ["job.failed"])
        tries = [{"at": "2026-01-01T00:00:00+00:00", "error": "E" * 500, "durationMs": 9}] * 70
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute(
                "INSERT INTO webhook_deliveries (webhook_id, organization_id, event, event_key,"
                " subject, status, tries, attempts, last_error, finished_at)"
                " SELECT %s, 'org-a', 'job.failed', 'k' || g, 'k' || g, 'failed', 70, %s::jsonb,"
                " repeat('E', 500), now() FROM generate_series(1, 200) g",
                (hook, json.dumps(tries)),
            )
        seen: list[str] = []
        cursor = ""
        while True:
            answer = await api.get(f"/webhooks/{hook}/deliveries?limit=200{cursor}", headers=AS_A)
            assert answer.status_code == 200
            assert len(answer.content) <= 4 * 1024 * 1024
            page = answer.json()
            seen += [d["deliveryId"] for d in page["deliveries"]]
            if page["nextCursor"] is None:
                break
            cursor = f"&cursor={page['nextCursor']}"
        assert len(seen) == len(set(seen)) == 200


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://localhost/hook", "loopback"),
        ("https://127.0.0.1/hook", "loopback"),
        ("https://10.0.0.7/hook", "private"),
        ("https://169.254.169.254/latest/meta-data", "link-local"),
        ("https://100.64.1.1/hook", "CGNAT"),
        ("https://[::1]/hook", "loopback"),
        ("https://[fd00::1]/hook", "unique-local"),
        ("http://93.184.215.14/hook", "must be https"),
    ],
)
async def test_a_url_reaching_a_private_address_is_refused_without_the_allow_list(
    fresh: tuple[Store, str], url: str, why: str
) -> None:
    store, db = fresh
    async with api_client(db, store=store) as api:
        answer = await api.post(
            "/webhooks", json={"url": url, "events": ["job.failed"]}, headers=AS_A
        )
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"]["field"] == "url" and why in answer.json()["error"]["message"]
        if url.startswith("https://localhost"):
            # The kind of address is answered, never the address a name resolved to (logged).
            assert "127.0.0.1" not in answer.text and "::1" not in answer.text
        assert (await api.get("/webhooks", headers=AS_A)).json()["webhooks"] == []


async def test_each_delivery_checks_the_address_again(
    fresh: tuple[Store, str], receiver: Receiver, http: httpx.AsyncClient
) -> None:
    """A host allowed when the webhook was made and refused now (the allow-list changed, or
    the name resolves elsewhere): the deliverer posts nothing and records why."""
    store, url = fresh
    async with api_client(url, store=store, webhooks=ALLOWED) as api:
        hook, _ = await subscribe(api, AS_A, receiver.url("/x"), ["job.completed"])
        await completed(store)
        strict = WebhookSettings(retry_base_ms=200, retry_max_ms=400)
        assert (await WebhookDeliverer(store, strict, http).run_once()).retried == 1
        [delivery] = (await api.get(f"/webhooks/{hook}/deliveries", headers=AS_A)).json()[
            "deliveries"
        ]
    assert receiver.posts == []
    assert delivery["lastStatusCode"] is None and "must be https" in delivery["lastError"]


async def test_wakeups_and_settled_objectives_are_owed_with_their_receipts(
    fresh: tuple[Store, str], receiver: Receiver, http: httpx.AsyncClient
) -> None:
    store, url = fresh
    async with api_client(url, store=store, webhooks=ALLOWED) as api:
        _, secret = await subscribe(
            api, AS_A, receiver.url("/w"), ["session.wakeup", "objective.settled"]
        )
    session = new_id("session")
    job, _ = await lifecycle.create(
        store,
        CreateRequest(
            agent_id="agent-w",
            organization_id="org-a",
            owner_session_id=session,
            source_actor_event_id="e1",
            source_tool_call_id=new_id("tool"),
            reply_route={"binding": "slack", "channel": "C1", "thread": None},
            input={"prompt": "work"},
        ),
    )
    # Its first turn asks its user a question: the job waits, its owner session is woken.
    dispatcher = AgentJobDispatcher(store, None, AgentJobSettings())
    await dispatcher.run_once()
    turn = (await lifecycle.get(store, job.agent_job_id)).queue_job_id  # type: ignore[union-attr]
    assert turn is not None
    worker = f"{turn}:attempt:1/1"
    assert (await ops.start_attempt(store, turn, attempt=1, worker_id=worker, lease_ms=LEASE)).ok
    question = {"outcome": "needs_input", "question": "q", "toolCallId": "c"}
    assert (await ops.complete(store, turn, worker_id=worker, attempt=1, result=question)).ok
    await dispatcher.run_once()
    objective_id = new_id("obj")
    await create_objective(store, objective_id)
    async with store.transaction() as tx:
        await objectives.update(
            tx, objective_id, lambda _: [Draft("objective.settled", {"status": "completed"})]
        )
    await WebhookDeliverer(store, ALLOWED, http).run_once()
    got = {b["type"]: b["data"] for b in (verify(p, secret) for p in receiver.at("/w"))}
    assert set(got) == {"session.wakeup", "objective.settled"}
    assert got["session.wakeup"]["sessionId"] == session
    assert got["session.wakeup"]["wakeup"]["data"]["status"] == "waiting_on_user"
    # Not the global position: it counts every organization's receipts (receipts/tenancy.py).
    assert got["session.wakeup"]["wakeup"]["position"] == HIDDEN_POSITION
    assert got["objective.settled"]["objective"]["status"] == "completed"


async def test_each_event_is_owed_only_to_the_subscriptions_that_ask_for_it(
    fresh: tuple[Store, str], receiver: Receiver
) -> None:
    """Event filters: a wakeup, a settled objective and a job's settle (the guarded
    one-statement settle too) are owed to the organization's subscriptions to that event, not
    to its others."""
    store, url = fresh
    async with api_client(url, store=store, webhooks=ALLOWED) as api:
        failed_only, _ = await subscribe(api, AS_A, receiver.url("/f"), ["job.failed"])
        completed_only, _ = await subscribe(api, AS_A, receiver.url("/c"), ["job.completed"])
    async with store.transaction() as tx:
        for event in (hooks.WAKEUP_EVENT, hooks.OBJECTIVE_EVENT):
            await hooks.owe(
                tx, "org-a", event, event_key=new_id("k"), subject=new_id("s"), data={"x": 1}
            )
    # The guarded settle (nothing appended since the read: it lands).
    job_id = await running(store)
    job, now = await store.get_job_with_now(job_id)
    assert job is not None
    fence = {"workerId": "w1", "attempt": 1, "settlementId": "w1"}
    settle = [Draft("job.completed", {**fence, "result": None})]
    assert await append_if_unchanged(store, job_id, job, settle, now, lease_held=True) is not None
    async with store.connection() as conn:
        cur = await conn.execute(
            "SELECT webhook_id, event FROM webhook_deliveries ORDER BY delivery_id"
        )
        rows = await cur.fetchall()
    assert rows == [(completed_only, "job.completed")], (failed_only, rows)


async def test_retention_keeps_a_job_while_its_delivery_is_owed_then_prunes_them_together(
    fresh: tuple[Store, str], receiver: Receiver
) -> None:
    """A retention shorter than the webhooks' retry window (or a receiver down for longer than
    it) must not drop a delivery still owed: the job stays until it is delivered or given up."""
    store, url = fresh
    async with api_client(url, store=store, webhooks=ALLOWED) as api:
        await subscribe(api, AS_A, receiver.url("/p"), ["job.completed"])
    job_id = await completed(store)
    assert await owed(store, job_id) == 1
    async with store.connection() as conn:
        await conn.execute(
            "UPDATE jobs SET updated_at = updated_at - interval '40 days' WHERE job_id = %s",
            (job_id,),
        )
        # No callback URL is configured: the redrive drops the settle's outbox row.
        await conn.execute("DELETE FROM callback_outbox WHERE job_id = %s", (job_id,))
    dry = await retention.prune(store, timedelta(days=30), dry_run=True)
    kept = await retention.prune(store, timedelta(days=30))
    assert dry.jobs == kept.jobs == 0 and await owed(store, job_id) == 1
    assert await store.get_job(job_id) is not None
    async with store.connection() as conn:  # its deliverer gave up (or delivered)
        await conn.execute(
            "UPDATE webhook_deliveries SET status = 'failed', finished_at = now() "
            "WHERE subject = %s",
            (job_id,),
        )

        # An objective of the organization may have the job's runtime id (`<id>~<tag>`): its
        # delivery is its own, not the job's (the prune deleted it with the job).
        await conn.execute(
            "INSERT INTO webhook_deliveries (webhook_id, organization_id, event, event_key, "
            "subject, status) SELECT webhook_id, organization_id, 'objective.settled', 'o-1', "
            "subject, 'delivered' FROM webhook_deliveries WHERE subject = %s",
            (job_id,),
        )

    pruned = await retention.prune(store, timedelta(days=30))
    assert pruned.jobs == 1 and pruned.removed["webhook_deliveries"] == 1
    async with store.connection() as conn:  # the job's went with it, the objective's stayed
        cursor = await conn.execute(
            "SELECT event FROM webhook_deliveries WHERE subject = %s", (job_id,)
        )
        assert await cursor.fetchall() == [("objective.settled",)]


def certificate(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for `name` (openssl), and its key."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            f"/CN={name}",
            "-addext",
            f"subjectAltName=DNS:{name}",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_a_post_connects_to_the_checked_address_with_the_urls_tls_name(
    tmp_path: Path,
) -> None:
    """The deliverer connects to the address it checked, not to whatever the name resolves to
    at connect time: the URL's host travels as the Host header and the TLS server name, and the
    certificate is verified against that name."""
    name = "hooks.receipt.test"  # resolves nowhere: only the checked address can be reached
    cert, key = certificate(tmp_path, name)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    names: list[str | None] = []
    server_tls.sni_callback = lambda _sock, sni, _ctx: names.append(sni)  # type: ignore[assignment,return-value]
    receiver = Receiver()
    server = await asyncio.start_server(receiver.handle, "127.0.0.1", 0, ssl=server_tls)
    port = server.sockets[0].getsockname()[1]
    trusting = ssl.create_default_context(cafile=str(cert))
    try:
        async with httpx.AsyncClient(verify=trusting) as client:
            target = Target(f"https://{name}:{port}/hook?x=1", name, "127.0.0.1")
            answer = await post(client, target, {"content-type": "application/json"}, b"{}", 5)
            assert answer.status_code == 200
            # A name the certificate does not carry fails the TLS check: the name is checked.
            wrong = Target(
                f"https://other.receipt.test:{port}/hook", "other.receipt.test", "127.0.0.1"
            )
            with pytest.raises(httpx.ConnectError):
                await post(client, wrong, {}, b"{}", 5)
    finally:
        server.close()
        await server.wait_closed()
    [posted] = receiver.posts
    assert posted.path == "/hook?x=1" and posted.headers["host"] == f"{name}:{port}"
    assert names[0] == name


async def test_a_connection_made_for_one_host_never_carries_anothers_post(tmp_path: Path) -> None:
    """Two webhook hosts at one address, a receiver that keeps connections open, a certificate
    for the first only: the second's post is not sent over the first's TLS connection (where
    its certificate would never be checked): it makes its own, and fails the TLS check."""
    cert, key = certificate(tmp_path, "a.receipt.test")
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    bodies: list[bytes] = []

    async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readline():
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            bodies.append(await reader.readexactly(length))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(keep_alive, "127.0.0.1", 0, ssl=server_tls)
    port = server.sockets[0].getsockname()[1]
    trusting = ssl.create_default_context(cafile=str(cert))
    try:
        async with httpx.AsyncClient(verify=trusting) as client:
            first = Target(f"https://a.receipt.test:{port}/a", "a.receipt.test", "127.0.0.1")
            assert (await post(client, first, {}, b"org A", 5)).status_code == 200
            other = Target(f"https://b.receipt.test:{port}/b", "b.receipt.test", "127.0.0.1")
            with pytest.raises(httpx.ConnectError):
                await post(client, other, {}, b"org B", 5)
    finally:
        server.close()
        await server.wait_closed()
    assert bodies == [b"org A"]


IDN = "bücher.example"
IDN_ASCII = "xn--bcher-kva.example"


async def test_an_internationalised_host_is_stored_in_its_idna_form_or_refused(
    fresh: tuple[Store, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A non-ASCII host is what DNS, the Host header and TLS cannot carry as written: the
    subscription stores its IDNA form; a name IDNA cannot encode is refused naming `url`."""

    async def public(host: str, port: int, owner: str | None = None) -> list[str]:
        return ["93.184.215.14"]

    monkeypatch.setattr(egress, "resolve", public)
    store, db = fresh
    async with api_client(db, store=store) as api:
        hook, _ = await subscribe(api, AS_A, "https://BÜCHER.example/hook?q=1", ["job.failed"])
        shown = (await api.get(f"/webhooks/{hook}", headers=AS_A)).json()
        assert shown["url"] == f"https://{IDN_ASCII}/hook?q=1"
        for bad in (f"https://-{IDN}/hook", f"https://{'ü' * 64}.example/hook"):
            answer = await api.post(
                "/webhooks", json={"url": bad, "events": ["job.failed"]}, headers=AS_A
            )
            assert answer.status_code == 422, answer.text
            assert answer.json()["error"]["field"] == "url"
            assert "internationalised" in answer.json()["error"]["message"]
    assert [w.url for w in (await hooks.page(store, "org-a", None, 10))[0]] == [
        f"https://{IDN_ASCII}/hook?q=1"
    ]


async def test_a_webhook_at_an_internationalised_host_is_delivered(
    fresh: tuple[Store, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`https://bücher.example:<port>/hook`, its name resolving to a receiver on loopback
    (which the egress rules are told here is public): the post carries the IDNA name in the Host
    header and SNI, and the certificate is checked against it. Posted as written, the Host
    header cannot be encoded and no try was ever made."""

    async def loopback(host: str, port: int, owner: str | None = None) -> list[str]:
        return ["127.0.0.1"]

    monkeypatch.setattr(egress, "resolve", loopback)
    monkeypatch.setattr(egress, "refused_reason", lambda address: None)
    cert, key = certificate(tmp_path, IDN_ASCII)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    names: list[str | None] = []
    server_tls.sni_callback = lambda _sock, sni, _ctx: names.append(sni)  # type: ignore[assignment,return-value]
    receiver = Receiver()
    server = await asyncio.start_server(receiver.handle, "127.0.0.1", 0, ssl=server_tls)
    port = server.sockets[0].getsockname()[1]
    store, db = fresh
    settings = WebhookSettings(retry_base_ms=1, retry_max_ms=1)
    try:
        async with api_client(db, store=store, webhooks=settings) as api:
            _, secret = await subscribe(api, AS_A, f"https://{IDN}:{port}/hook", ["job.completed"])
        await completed(store)
        trusting = ssl.create_default_context(cafile=str(cert))
        async with httpx.AsyncClient(verify=trusting) as client:
            assert (await WebhookDeliverer(store, settings, client).run_once()).delivered == 1
    finally:
        server.close()
        await server.wait_closed()
    [posted] = receiver.posts
    assert posted.headers["host"] == f"{IDN_ASCII}:{port}" and names == [IDN_ASCII]
    assert verify(posted, secret)["type"] == "job.completed"


async def test_whatever_a_post_raises_is_a_failed_try_that_gives_up(
    fresh: tuple[Store, str],
    receiver: Receiver,
    http: httpx.AsyncClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An exception the deliverer does not expect from the check or the post is recorded as a
    try (its error, a backoff) and given up after the tries, not left to lapse and come back
    forever; only a failure to record the try lets the claim lapse."""
    store, url = fresh
    settings = ALLOWED.model_copy(update={"max_tries": 2, "retry_base_ms": 1, "retry_max_ms": 1})

    async def broken(*args: Any, **kwargs: Any) -> httpx.Response:
        return "ü".encode("ascii")  # type: ignore[return-value]  # raises UnicodeEncodeError

    async with api_client(url, store=store, webhooks=settings) as api:
        hook, _ = await subscribe(api, AS_A, receiver.url("/x"), ["job.completed"])
        await completed(store)
        monkeypatch.setattr(egress, "post", broken)
        deliverer = WebhookDeliverer(store, settings, http)
        assert (await deliverer.run_once()).retried == 1
        [delivery] = (await api.get(f"/webhooks/{hook}/deliveries", headers=AS_A)).json()[
            "deliveries"
        ]
        assert delivery["status"] == "pending" and delivery["tries"] == 1
        assert delivery["lastError"].startswith("UnicodeEncodeError: ")
        await asyncio.sleep(0.05)
        assert (await deliverer.run_once()).failed == 1
        [delivery] = (await api.get(f"/webhooks/{hook}/deliveries", headers=AS_A)).json()[
            "deliveries"
        ]
    assert delivery["status"] == "failed" and delivery["tries"] == 2
    assert (await deliverer.run_once()).claimed == 0
    assert receiver.posts == []

    async def unrecorded(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the database is away")

    await completed(store)
    monkeypatch.setattr(webhook_tries, "record_try", unrecorded)
    assert (await deliverer.run_once()).lapsed == 1


def test_the_client_manages_webhooks_against_a_real_api(make_database: Any, tmp_path: Path) -> None:
    """`receipt-client` over HTTP to a `receipt api` process: every webhook call, its answers
    read into the generated models, its refusals into the typed errors."""
    url = make_database()
    with (
        running_api(url, tmp_path, RECEIPT_WEBHOOK_ALLOWED_HOSTS="127.0.0.1") as api,
        Client(api.url, TOKEN_A) as client,
    ):
        created = client.create_webhook("http://127.0.0.1:9/hook", ["job.failed"], description="d")
        assert created.secret.startswith("whsec_")
        hook = created.webhook.webhook_id
        assert client.get_webhook(hook).events == ["job.failed"]
        assert [w.webhook_id for w in client.list_webhooks().webhooks] == [hook]
        assert client.test_webhook(hook).webhook_id == hook
        [delivery] = client.webhook_deliveries(hook).deliveries
        assert (delivery.event, delivery.status, delivery.tries) == ("webhook.test", "pending", 0)
        assert client.rotate_webhook_secret(hook).secret not in (created.secret, "")
        with pytest.raises(ClientInvalidInput) as refused:
            client.create_webhook("https://10.0.0.1/hook", ["job.failed"])
        assert refused.value.field == "url"
        client.delete_webhook(hook)
        with pytest.raises(NotFound):
            client.get_webhook(hook)


async def test_one_organizations_dead_endpoint_holds_up_no_other(
    fresh: tuple[Store, str], receiver: Receiver, http: httpx.AsyncClient
) -> None:
    """Organization A's endpoint never answers: at most `RECEIPT_WEBHOOK_ORG_IN_FLIGHT` of its
    posts hang, across claims, while B's deliveries are claimed and delivered beside them."""
    store, url = fresh
    settings = ALLOWED.model_copy(update={"org_in_flight": 2, "timeout_ms": 30_000})
    receiver.hang.add("/dead")
    async with api_client(url, store=store, webhooks=settings) as api:
        await subscribe(api, AS_A, receiver.url("/dead"), ["job.completed"])
        await subscribe(api, AS_B, receiver.url("/alive"), ["job.completed"])
    for _ in range(5):
        await completed(store, "org-a")
    deliverer = WebhookDeliverer(store, settings, http)
    running_loop = asyncio.create_task(deliverer.run())
    try:
        await asyncio.sleep(0.3)  # A's first claims hang at its endpoint
        for _ in range(3):
            await completed(store, "org-b")
        deadline = time.monotonic() + 10
        while len(receiver.at("/alive")) < 3:
            assert time.monotonic() < deadline, "B's deliveries waited behind A's dead endpoint"
            await asyncio.sleep(0.05)
        assert len(receiver.at("/dead")) == 2  # A's cap, however often the deliverer claimed
    finally:
        running_loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running_loop
        receiver.release.set()


async def test_claims_go_round_the_organizations_however_many_have_a_backlog(
    fresh: tuple[Store, str],
) -> None:
    """Claims walked the organizations in the planner's order under one LIMIT: once enough of
    them had a backlog at a dead endpoint (8 per driver: 32 ÷ 4), every organization after them
    was never claimed. A claim takes each organization's first due delivery, then each one's
    second, and so on: ten organizations, a limit of 32, four each in flight — every one gets
    three or four."""
    store, url = fresh
    orgs = [f"org-{n:02d}" for n in range(10)]
    with psycopg.connect(url, autocommit=True) as conn:
        for org in orgs:
            conn.execute(
                "INSERT INTO webhooks (webhook_id, organization_id, url, events, secret) "
                "VALUES (%s, %s, 'https://example.com/h', '{job.completed}', 's')",
                (f"wh-{org}", org),
            )
            for n in range(6):
                conn.execute(
                    "INSERT INTO webhook_deliveries (webhook_id, organization_id, event, "
                    "event_key, subject) VALUES (%s, %s, 'job.completed', %s, %s)",
                    (f"wh-{org}", org, f"k{n}", f"j{n}"),
                )
    for _ in range(3):
        claimed = await hooks.claim(store, limit=32, per_org=4, lease_ms=60_000)
        per_org = {org: sum(c.organization_id == org for c in claimed) for org in orgs}
        assert len(claimed) == 32 and set(per_org.values()) <= {3, 4}, per_org
        with psycopg.connect(
            url, autocommit=True
        ) as conn:  # their posts end: the next claim starts afresh
            conn.execute("UPDATE webhook_deliveries SET claimed_until = NULL, next_try_at = now()")


async def test_an_ipv6_literal_receiver_gets_a_bracketed_host_header() -> None:
    """The Host header of a post to `http://[2001:db8::1]:8443/…` was `2001:db8::1:8443`, which
    receivers refuse; it is bracketed as the URL writes it."""
    receiver = Receiver()
    try:
        server = await asyncio.start_server(receiver.handle, "::1", 0)
    except OSError:
        pytest.skip("no IPv6 loopback here")
    port = server.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient() as client:
            target = Target(f"http://[::1]:{port}/h", "::1", "::1")
            assert (await post(client, target, {}, b"{}", 5)).status_code == 200
    finally:
        server.close()
        await server.wait_closed()
    [posted] = receiver.posts
    assert posted.headers["host"] == f"[::1]:{port}"


async def test_a_stopped_deliverer_claims_no_more_and_cuts_a_post_past_its_grace(
    fresh: tuple[Store, str],
    receiver: Receiver,
    http: httpx.AsyncClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """At the driver's SIGTERM the deliverer stops claiming (another driver takes what comes due)
    and waits for the posts in flight; one its receiver has not answered within the grace is cut
    (`webhook.drain_cut`): its claim lapses and it is posted again."""
    store, url = fresh
    settings = ALLOWED.model_copy(update={"timeout_ms": 30_000})
    receiver.hang.add("/dead")
    async with api_client(url, store=store, webhooks=settings) as api:
        await subscribe(api, AS_A, receiver.url("/dead"), ["job.completed"])
        await subscribe(api, AS_B, receiver.url("/alive"), ["job.completed"])
    await completed(store, "org-a")
    stop = asyncio.Event()
    running_loop = asyncio.create_task(WebhookDeliverer(store, settings, http).run(stop, 0.5))
    try:

        async def dead_posts() -> int:
            return len(receiver.at("/dead"))

        await eventually(dead_posts, lambda n: n == 1, what="the post in flight")
        stop.set()
        stopped = time.monotonic()
        await completed(store, "org-b")  # due after the stop: left to the other deliverers
        await asyncio.wait_for(running_loop, 5)
        waited_s = time.monotonic() - stopped
    finally:
        running_loop.cancel()
        receiver.release.set()
    assert 0.5 <= waited_s < 2
    assert receiver.at("/alive") == []
    assert [r for r in caplog.records if getattr(r, "event", None) == "webhook.drain_cut"]
