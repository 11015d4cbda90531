"""Per-organization webhooks: subscriptions, the delivery outbox and its retry schedule.

A subscription names an https URL, the events it wants and a signing secret. Deliveries are
owed in the transaction of the receipt that causes them: a job's settle writes them in its own
statement (receipts/sql/queries.sql `append_job`, guarded.sql), an agent job's wakeup and an
objective's settlement call `owe` in theirs. The driver's deliverer
(roles/delivery/webhooks.py) claims due rows, posts them signed and records each try here.
Egress rules (which URLs may be posted to) are activities/webhook_egress.py's.
"""

from __future__ import annotations

import base64
import random
import secrets
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

import idna
from psycopg.types.json import Jsonb
from pydantic import Field

from receipts.errors import ConflictError, InvalidInput
from receipts.jobs import Job
from receipts.kinds import redact_payload
from receipts.settings import ReceiptSettings, Whole
from receipts.store import Store, Tx, translate_errors
from receipts.streams import dumps
from receipts.tenancy import untagged

JOB_EVENTS: tuple[str, ...] = ("job.completed", "job.failed", "job.canceled")
WAKEUP_EVENT = "session.wakeup"
OBJECTIVE_EVENT = "objective.settled"
EVENTS: tuple[str, ...] = (*JOB_EVENTS, WAKEUP_EVENT, OBJECTIVE_EVENT)
"""What a subscription may ask for: a job's terminal statuses (the global callbacks' events,
prefixed), an owner session's wakeup and an objective's settlement."""
TEST_EVENT = "webhook.test"

MAX_URL_CHARS = 2_000
MAX_DESCRIPTION_CHARS = 500
SECRET_BYTES = 32
# A try's error as recorded (`lastError` and its entry in `attempts`): the exception's text is
# partly the receiver's (a bad head line of its answer, up to 16 KB), so it is cut to this.
MAX_ERROR_CHARS = 500
DELIVERY_STATUSES: tuple[str, ...] = ("pending", "delivered", "failed")
KEYED_NAMESPACE = uuid.UUID("0b8f3f3e-5a43-4c1e-9d0e-6a1f2b7c9d55")
"""A create's Idempotency-Key names the webhook uuid5(this, organization and key)."""


class WebhookSettings(ReceiptSettings):
    """Per-organization webhooks: egress, caps and the retry schedule (README, "Webhooks")."""

    accepts: ClassVar[dict[str, str]] = {
        "allowed_hosts": "comma-separated host names or addresses",
    }
    accepts_any: ClassVar[str] = "a whole number (1 or more)"

    # Hosts an organization's webhook may name over plain http and whatever they resolve to
    # (loopback, private): the operator's own receivers. Everything else: https, public only.
    allowed_hosts: str = Field(default="", alias="RECEIPT_WEBHOOK_ALLOWED_HOSTS")
    max_per_organization: Whole = Field(default=20, ge=1, alias="RECEIPT_WEBHOOK_MAX_PER_ORG")
    # A delivery is tried until it is this old or has had this many tries, then it failed.
    retry_for_ms: Whole = Field(default=86_400_000, ge=1, alias="RECEIPT_WEBHOOK_RETRY_FOR_MS")
    # Enough that the window ends a delivery, not its tries: 25 tries of full-jitter backoff
    # capped at 1 h took about 8 h, not the 24 h of `retry_for_ms`; 70 take about 30 h.
    max_tries: Whole = Field(default=70, ge=1, alias="RECEIPT_WEBHOOK_MAX_TRIES")
    retry_base_ms: Whole = Field(default=5_000, ge=1, alias="RECEIPT_WEBHOOK_RETRY_BASE_MS")
    retry_max_ms: Whole = Field(default=3_600_000, ge=1, alias="RECEIPT_WEBHOOK_RETRY_MAX_MS")
    # Posts of one organization in flight at once (every deliverer together), and of one
    # deliverer process in all: a dead endpoint holds only its organization's share.
    org_in_flight: Whole = Field(default=4, ge=1, alias="RECEIPT_WEBHOOK_ORG_IN_FLIGHT")
    concurrency: Whole = Field(default=32, ge=1, alias="RECEIPT_WEBHOOK_CONCURRENCY")
    timeout_ms: Whole = Field(default=10_000, ge=1, alias="RECEIPT_WEBHOOK_TIMEOUT_MS")
    poll_interval_ms: Whole = Field(default=1_000, ge=1, alias="RECEIPT_WEBHOOK_POLL_INTERVAL_MS")

    @property
    def hosts(self) -> frozenset[str]:
        """The allow-listed hosts, lower case, without brackets, an internationalised name in
        its IDNA form (as a webhook's URL is stored: `ascii_url`)."""
        return frozenset(
            _listed(h.strip().lower().strip("[]"))
            for h in self.allowed_hosts.split(",")
            if h.strip()
        )


def _listed(host: str) -> str:
    try:
        return ascii_host(host)
    except ValueError:
        return host  # no URL's host can be it: it matches nothing


def ascii_host(host: str) -> str:
    """`host` as DNS, the Host header and TLS carry it: an internationalised name in its IDNA
    (punycode) form, `bücher.example` -> `xn--bcher-kva.example` (UTS 46 mapping, as browsers
    do); an ASCII host as it is. ValueError for a name IDNA cannot encode."""
    if host.isascii():
        return host
    try:
        return idna.encode(host, uts46=True).decode("ascii")
    except idna.IDNAError as exc:
        raise ValueError(str(exc) or type(exc).__name__) from None


def ascii_url(url: str) -> str:
    """`url` with its host as `ascii_host` gives it (the rest as written; httpx encodes a
    non-ASCII path or query itself). ValueError for a host IDNA cannot encode."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if host.isascii():
        return url
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = ascii_host(host) + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{netloc}" if userinfo else netloc))


def retry_delay_ms(tries: int, base_ms: int, max_ms: int, rng: random.Random | None = None) -> int:
    """The wait before the next try after `tries` failed ones: exponential backoff with full
    jitter, uniform in [0, min(max_ms, base_ms × 2^(tries-1))] (so many receivers that failed at
    once do not come back at once)."""
    ceiling = min(max_ms, base_ms * 2 ** max(tries - 1, 0))
    return int((rng or random).uniform(0, ceiling))


def gives_up(tries: int, age_ms: float, settings: WebhookSettings) -> bool:
    """True when a delivery that has failed `tries` times and is `age_ms` old is failed for good."""
    return tries >= settings.max_tries or age_ms >= settings.retry_for_ms


def new_secret() -> str:
    """A Standard Webhooks signing secret: `whsec_` and the base64 of 32 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


# --- the subscription ---------------------------------------------------------------------


@dataclass(frozen=True)
class Webhook:
    """A subscription as stored (its secret is not part of it: answered once, never read)."""

    webhook_id: str
    organization_id: str
    url: str
    events: list[str]
    description: str | None
    created_at: datetime
    secret_rotated_at: datetime | None
    delivery_key: str = field(default="", repr=False)  # never shown (receipts/webhook_ids.py)

    def to_json(self) -> dict[str, Any]:
        return {
            "webhookId": self.webhook_id,
            "organizationId": self.organization_id,
            "url": self.url,
            "events": list(self.events),
            "description": self.description,
            "createdAt": self.created_at.isoformat(),
            "secretRotatedAt": self.secret_rotated_at.isoformat()
            if self.secret_rotated_at
            else None,
        }


@dataclass(frozen=True)
class WebhookCreate:
    """A validated `POST /webhooks` body."""

    url: str
    events: list[str]
    description: str | None


def parse_create(body: Any) -> WebhookCreate:
    """`{url, events, description?}` checked, or `InvalidInput` naming the field and what it
    accepts. The URL's syntax only: its host and scheme are the egress rules' to judge."""
    if not isinstance(body, dict):
        raise InvalidInput("body", "the request body must be a JSON object")
    unknown = sorted(set(body) - {"url", "events", "description"})
    if unknown:
        raise InvalidInput(
            unknown[0], f"unknown field {unknown[0]!r}", ["url", "events", "description"]
        )
    url = body.get("url")
    if not isinstance(url, str) or not url.strip():
        raise InvalidInput("url", "url must be an absolute http(s) URL")
    if len(url) > MAX_URL_CHARS:
        raise InvalidInput("url", f"url must be at most {MAX_URL_CHARS} characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a bad port raises here
    except ValueError as exc:
        raise InvalidInput("url", f"url is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput("url", "url must be an absolute http(s) URL", ["https", "http"])
    if parts.username is not None or parts.password is not None:
        raise InvalidInput("url", "url must not carry credentials (the secret signs each post)")
    if any(c.isspace() or ord(c) < 32 for c in url):
        raise InvalidInput("url", "url must not contain whitespace or control characters")
    try:
        # Stored, checked and posted to in the form DNS, the Host header and TLS carry.
        url = ascii_url(url)
    except ValueError as exc:
        raise InvalidInput(
            "url", f"url's host {parts.hostname!r} is not a valid internationalised name: {exc}"
        ) from None
    events = body.get("events")
    if not isinstance(events, list) or not events:
        raise InvalidInput("events", "events must be a non-empty list of event names", EVENTS)
    for index, event in enumerate(events):
        if event not in EVENTS:
            raise InvalidInput(
                f"events[{index}]", f"events[{index}] must be one of the events", EVENTS
            )
    description = body.get("description")
    if description is not None and (
        not isinstance(description, str) or len(description) > MAX_DESCRIPTION_CHARS
    ):
        raise InvalidInput(
            "description", f"description must be text of at most {MAX_DESCRIPTION_CHARS} characters"
        )
    return WebhookCreate(url, list(dict.fromkeys(events)), description)


def _webhook(row: Sequence[Any]) -> Webhook:
    return Webhook(row[0], row[1], row[2], list(row[3]), row[4], row[5], row[6], row[7])


class TooManyWebhooks(ConflictError):
    """The organization has its maximum of subscriptions."""


async def create(
    store: Store,
    organization_id: str,
    request: WebhookCreate,
    *,
    max_per_organization: int,
    key: str | None = None,
) -> tuple[Webhook, str, bool]:
    """Store a subscription for `organization_id`; returns it, its secret (answered once) and
    True. Creates of one organization are serialised, so the cap holds; `TooManyWebhooks` past
    it. With `key` (the create's Idempotency-Key) the subscription is named by it: a create sent
    again finds the one it made, answered with its secret and False (its caller may never have
    heard it), or ConflictError when the key made another one."""
    secret = new_secret()
    webhook_id = f"wh_{uuid.uuid4().hex}"
    if key is not None:
        webhook_id = "wh_" + uuid.uuid5(KEYED_NAMESPACE, organization_id + "\x00" + key).hex
    async with store.transaction() as tx:
        await tx.fetch_one("webhook_org_lock", {"organization_id": organization_id})
        ids = {"webhook_id": webhook_id, "organization_id": organization_id}
        if key is not None and (made := await tx.fetch_one("webhook_keyed", ids)) is not None:
            webhook = _webhook(made)
            if (webhook.url, webhook.events, webhook.description) != (
                request.url,
                request.events,
                request.description,
            ):
                raise ConflictError("this Idempotency-Key made another webhook")
            return webhook, str(made[8]), False
        count = await tx.fetch_one("webhook_count", {"organization_id": organization_id})
        if count is not None and count[0] >= max_per_organization:
            raise TooManyWebhooks(
                f"organization already has {count[0]} webhooks (at most {max_per_organization})"
            )
        row = await tx.fetch_one(
            "webhook_insert",
            {
                **ids,
                "url": request.url,
                "events": request.events,
                "description": request.description,
                "secret": secret,
            },
        )
    assert row is not None
    return _webhook(row), secret, True


async def get(store: Store, webhook_id: str) -> Webhook | None:
    with translate_errors():
        row = await store.fetch_one("webhook_get", {"webhook_id": webhook_id})
    return _webhook(row) if row else None


async def page(
    store: Store,
    organization_id: str | None,
    after: tuple[datetime, str] | None,
    limit: int,
) -> tuple[list[Webhook], bool]:
    """Subscriptions newest first after the keyset `after`: one organization's (None: all)."""
    rows = await store.fetch(
        "webhooks_page",
        {
            "organization_id": organization_id,
            "after_at": after[0] if after else None,
            "after_key": after[1] if after else None,
            "limit": limit + 1,
        },
    )
    return [_webhook(r) for r in rows[:limit]], len(rows) > limit


async def delete(store: Store, webhook_id: str) -> bool:
    """Delete the subscription and every delivery it still owes (they go with it)."""
    return bool(await store.fetch("webhook_delete", {"webhook_id": webhook_id}))


async def rotate_secret(store: Store, webhook_id: str) -> tuple[Webhook, str] | None:
    """A new secret for the subscription (answered once); the next post is signed with it."""
    secret = new_secret()
    row = await store.fetch_one("webhook_rotate", {"webhook_id": webhook_id, "secret": secret})
    return (_webhook(row), secret) if row else None


async def send_test(store: Store, webhook: Webhook) -> int:
    """Owe the subscription one `webhook.test` delivery (through the same outbox); its id."""
    test_id = f"test_{uuid.uuid4().hex}"
    data = {"webhookId": webhook.webhook_id, "testId": test_id}
    row = await store.fetch_one(
        "webhook_owed_test",
        {"webhook_id": webhook.webhook_id, "event_key": test_id, "data": Jsonb(data, dumps=dumps)},
    )
    if row is None:
        raise ConflictError(f"webhook {webhook.webhook_id} was deleted")
    return int(row[0])


async def owe(
    tx: Tx,
    organization_id: str | None,
    event: str,
    *,
    event_key: str,
    subject: str,
    data: Mapping[str, Any],
) -> None:
    """In the caller's transaction (the one writing the receipt of `event`): owe it to every
    subscription of `organization_id` to `event`. None (the runtime's own work): nothing."""
    if organization_id is None:
        return
    await tx.execute(
        "webhook_owed_event",
        {
            "organization_id": organization_id,
            "event": event,
            "event_key": event_key,
            "subject": subject,
            "data": Jsonb(untagged(dict(data), organization_id), dumps=dumps),
        },
    )


# --- deliveries ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Claimed:
    """A delivery a deliverer claimed: what to post and where (the secret is read just before
    the post, `signing_secret`: a rotation since the claim signs it)."""

    delivery_id: int
    webhook_id: str
    organization_id: str
    event: str
    event_key: str
    subject: str
    data: Any
    tries: int
    created_at: datetime
    url: str
    now: datetime
    claimed_until: datetime  # the claim's fence: a try is recorded only under it

    @property
    def message_key(self) -> str:
        """What names this delivery for its `webhook-id`: the same on every try."""
        return f"webhook:{self.webhook_id}:{self.event}:{self.event_key}"

    @property
    def counted_as(self) -> str:
        """The `event` label its tries are counted under (a test post's is `webhook.test`)."""
        return self.event if self.event in EVENTS else TEST_EVENT


async def claim(store: Store, *, limit: int, per_org: int, lease_ms: int) -> list[Claimed]:
    """Claim up to `limit` due deliveries, at most `per_org` of one organization in flight.
    Claims of every deliverer take turns (a transaction-scoped lock), so each counts what the
    others have in flight: the cap holds across drivers."""
    async with store.transaction() as tx:
        await tx.lock_key("webhook-deliveries:claim")
        rows = await tx.fetch(
            "webhook_deliveries_claim",
            {"limit": limit, "per_org": per_org, "lease_ms": lease_ms},
        )
    return [Claimed(*row) for row in rows]


async def signing_secret(store: Store, delivery: Claimed) -> str | None:
    """The subscription's secret now, to sign `delivery`'s post with (a rotation since the claim
    signs it); None when the delivery is no longer this claim's to post: its subscription was
    deleted (its deliveries went with it), or the claim lapsed and another deliverer took it."""
    row = await store.fetch_one(
        "webhook_delivery_secret",
        {"delivery_id": delivery.delivery_id, "claimed_until": delivery.claimed_until},
    )
    return str(row[0]) if row else None


async def event_data(store: Store, delivery: Claimed) -> dict[str, Any] | None:
    """The `data` of the event posted: stored with the delivery, or for a job's event the job
    as its organization sees it (its ids untagged, `task.env` redacted). None: the job is gone."""
    if delivery.data is not None:
        return dict(delivery.data)
    row = await store.fetch_one("webhook_job_state", {"job_id": delivery.subject})
    if row is None:
        return None
    job = Job.model_validate(row[0])
    shown = {**job.to_json(), "payload": redact_payload(job.payload)}
    return {"job": untagged(shown, delivery.organization_id)}


def body(delivery: Claimed, data: Mapping[str, Any]) -> bytes:
    """The posted body, Standard Webhooks' shape: `{type, timestamp, data}` (the time the event
    was owed, so every try sends the same bytes)."""
    return dumps(
        {"type": delivery.event, "timestamp": delivery.created_at.isoformat(), "data": data}
    ).encode()


def delivery_json(row: Sequence[Any]) -> dict[str, Any]:
    """A `webhook_deliveries_page` row as the API shows it."""
    (did, event, key, subject, status, tries, next_try, _claimed, code, error, attempts) = row[:11]
    created_at, finished_at = row[11], row[12]
    return {
        "deliveryId": str(did),
        "event": event,
        "eventKey": key,
        "subject": subject,
        "status": status,
        "tries": tries,
        "nextTryAt": next_try.isoformat() if status == "pending" else None,
        "lastStatusCode": code,
        "lastError": error,
        "attempts": attempts,
        "createdAt": created_at.isoformat(),
        "finishedAt": finished_at.isoformat() if finished_at else None,
    }


async def deliveries_page(
    store: Store, webhook_id: str, after_id: int | None, limit: int
) -> tuple[list[dict[str, Any]], bool]:
    """A subscription's deliveries newest first (after the delivery `after_id`), and whether
    more follow."""
    rows = await store.fetch(
        "webhook_deliveries_page",
        {"webhook_id": webhook_id, "after_id": after_id, "limit": limit + 1},
    )
    return [delivery_json(r) for r in rows[:limit]], len(rows) > limit
