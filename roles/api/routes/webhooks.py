"""Per-organization webhook routes: subscribe, list, read, delete, rotate the secret, send a
test event, and see the deliveries (README, "Webhooks")."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from activities import webhook_egress as egress
from receipts import metrics, webhook_ids
from receipts import webhooks as hooks
from receipts.errors import ConflictError, InvalidInput
from receipts.kinds import MAX_ID_LENGTH
from receipts.tenancy import untagged
from receipts.webhooks import Webhook
from roles.api.auth import JOBS_READ, JOBS_WRITE, Principal
from roles.api.body import IdempotencyKey, decode_cursor, encode_cursor
from roles.api.deps import ApiError, ApiState, Caller, State, read_json_body, require_scope
from roles.api.deps import takes_query as _takes_query
from roles.api.schema import _Doc, errors_documented, json_body_documented
from roles.api.sse import last_shown, within_budget

log = logging.getLogger("roles.api.webhooks")


def _changed(action: str, webhook: Webhook, **extra: object) -> None:
    """Where an organization's events go, and when its secret changed, leave a trace: a log
    line and `receipt_webhook_changes_total{action}` (never the secret)."""
    metrics.WEBHOOK_CHANGES.labels(action).inc()
    log.info(
        "webhook %s",
        action.replace("_", " "),
        extra={
            "event": f"webhook.{action}",
            "webhookId": webhook.webhook_id,
            "organizationId": webhook.organization_id,
            **extra,
        },
    )


router = APIRouter(tags=["webhooks"])
SHOWN_LIMIT = webhook_ids.LIMIT

WebhookId = Annotated[str, Path(alias="webhookId", description="The webhook id")]
EventName = Literal[hooks.EVENTS]  # type: ignore[valid-type]


class WebhookCreateBody(BaseModel):
    """`POST /webhooks`: the URL to post to and the events it wants (validated by
    `receipts.webhooks.parse_create`, which names the field at fault, and the egress rules)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
    url: str = Field(
        min_length=1,
        max_length=hooks.MAX_URL_CHARS,
        description="https (plain http only to a host on RECEIPT_WEBHOOK_ALLOWED_HOSTS); its host "
        "must resolve to public addresses only",
    )
    events: list[EventName] = Field(min_length=1)
    description: str | None = Field(default=None, max_length=hooks.MAX_DESCRIPTION_CHARS)
    organization_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ID_LENGTH,
        description="Admin tokens only: the organization of the webhook",
    )


class WebhookView(_Doc):
    """A subscription (its secret is never shown again after create or rotate)."""

    webhook_id: str
    organization_id: str
    url: str
    events: list[EventName]
    description: str | None = None
    created_at: datetime
    secret_rotated_at: datetime | None = None


class WebhookCreated(_Doc):
    """The subscription and its signing secret (`whsec_…`, Standard Webhooks): shown this once."""

    webhook: WebhookView
    secret: str


class WebhookList(_Doc):
    """One page of subscriptions, newest first; pass `nextCursor` as `cursor` for the next."""

    webhooks: list[WebhookView]
    next_cursor: str | None


class WebhookTestAccepted(_Doc):
    """A `webhook.test` delivery was owed; `GET /webhooks/{id}/deliveries` shows how it went."""

    webhook_id: str
    delivery_id: str


class WebhookTry(_Doc):
    """One try of a delivery: when, the receiver's status code or the error, how long."""

    at: datetime
    status_code: int | None = None
    error: str | None = None
    duration_ms: int | None = None


class WebhookDelivery(_Doc):
    """One event owed to a subscription: `pending` (with its next try), `delivered`, `failed`."""

    delivery_id: str
    event: str
    event_key: str
    subject: str
    status: Literal[hooks.DELIVERY_STATUSES]  # type: ignore[valid-type]
    tries: int
    next_try_at: datetime | None = None
    last_status_code: int | None = None
    last_error: str | None = None
    attempts: list[WebhookTry] = Field(default_factory=list)
    created_at: datetime
    finished_at: datetime | None = None


class WebhookDeliveryList(_Doc):
    """One page of a subscription's deliveries, newest first; `nextCursor` continues."""

    deliveries: list[WebhookDelivery]
    next_cursor: str | None


def _view(webhook: Webhook) -> dict[str, Any]:
    return webhook.to_json()


async def _visible(state: ApiState, caller: Principal, webhook_id: str) -> Webhook:
    """The subscription when the caller may see it; another organization's answers as none."""
    webhook = await hooks.get(state.require_store(), webhook_id)
    if webhook is None or not caller.sees(webhook.organization_id):
        raise ApiError(404, "not_found", f"no webhook {webhook_id!r}", field="webhookId")
    return webhook


def _organization(caller: Principal, body: dict[str, Any]) -> str:
    """The organization a create is for: the token's; an admin token names it."""
    named = body.pop("organizationId", None)
    if caller.organization_id is None:
        if not isinstance(named, str) or not named.strip() or len(named) > MAX_ID_LENGTH:
            raise InvalidInput(
                "organizationId",
                "an admin token must name the organizationId of the webhook (at most "
                f"{MAX_ID_LENGTH} characters)",
            )
        return named
    if named is not None and named != caller.organization_id:
        raise ApiError(
            403,
            "forbidden",
            "organizationId is not the token's organization",
            field="organizationId",
        )
    return caller.organization_id


@router.post(
    "/webhooks",
    response_model=WebhookCreated,
    status_code=201,
    responses={
        200: {"model": WebhookCreated, "description": "Sent again with its Idempotency-Key"},
        **errors_documented(400, 401, 403, 409, 413, 415, 422, 429, 503),
    },
    openapi_extra=json_body_documented("WebhookCreateBody"),
    dependencies=[_takes_query()],
)
async def create_webhook(
    request: Request, state: State, caller: Caller, idempotency_key: IdempotencyKey = None
) -> JSONResponse:
    """Subscribe `url` to `events` of the token's organization (201). The answer holds the
    signing secret, shown this once; a create sent again with its `Idempotency-Key` answers 200
    with the subscription it made and that secret (409 `conflict` for another body). The token
    needs `jobs:read` and `jobs:write`; 409 past `RECEIPT_WEBHOOK_MAX_PER_ORG` subscriptions;
    422 for a URL the egress rules refuse."""
    require_scope(caller, JOBS_READ)
    require_scope(caller, JOBS_WRITE)
    body = await read_json_body(request, state.settings.max_body_bytes)
    if not isinstance(body, dict):
        raise InvalidInput("body", "the request body must be a JSON object")
    organization_id = _organization(caller, body)
    parsed = hooks.parse_create(body)
    try:
        await egress.check(parsed.url, state.webhooks, organization_id)
    except egress.EgressRefused as exc:
        raise InvalidInput("url", str(exc)) from None
    try:
        webhook, secret, created = await hooks.create(
            state.require_store(),
            organization_id,
            parsed,
            max_per_organization=state.webhooks.max_per_organization,
            key=idempotency_key,
        )
    except hooks.TooManyWebhooks as exc:
        raise ApiError(409, "too_many_webhooks", str(exc)) from exc
    except ConflictError as exc:
        raise ApiError(409, "conflict", str(exc), field="Idempotency-Key") from exc
    if not created:
        return JSONResponse({"webhook": _view(webhook), "secret": secret})
    # The receiver's host only: a URL may carry its own token in its path or query.
    _changed("created", webhook, host=urlsplit(webhook.url).hostname, events=webhook.events)
    return JSONResponse({"webhook": _view(webhook), "secret": secret}, status_code=201)


@router.get(
    "/webhooks",
    response_model=WebhookList,
    responses=errors_documented(401, 403, 422, 503),
    dependencies=[_takes_query("limit", "cursor")],
)
async def list_webhooks(
    state: State,
    caller: Caller,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
    cursor: Annotated[str | None, Query(max_length=1000)] = None,
) -> JSONResponse:
    """The token's organization's subscriptions (an admin's: every organization's), newest
    first, with a cursor."""
    require_scope(caller, JOBS_READ)
    after = decode_cursor(cursor)
    items, more = await hooks.page(
        state.require_store(),
        None if caller.admin else caller.organization_id,
        (after.created_at, after.key) if after else None,
        limit,
    )
    last = items[-1] if more else None
    next_cursor = encode_cursor(last.created_at, last.webhook_id) if last else None
    return JSONResponse({"webhooks": [_view(w) for w in items], "nextCursor": next_cursor})


@router.get(
    "/webhooks/{webhookId}",
    response_model=WebhookView,
    responses=errors_documented(401, 403, 404, 422, 503),
    dependencies=[_takes_query()],
)
async def get_webhook(state: State, caller: Caller, webhook_id: WebhookId) -> JSONResponse:
    """The subscription (without its secret)."""
    require_scope(caller, JOBS_READ)
    return JSONResponse(_view(await _visible(state, caller, webhook_id)))


@router.delete(
    "/webhooks/{webhookId}",
    status_code=204,
    responses=errors_documented(401, 403, 404, 422, 503),
    dependencies=[_takes_query()],
)
async def delete_webhook(state: State, caller: Caller, webhook_id: WebhookId) -> Response:
    """Unsubscribe (204): deliveries it still owes are dropped with it."""
    require_scope(caller, JOBS_WRITE)
    webhook = await _visible(state, caller, webhook_id)
    if not await hooks.delete(state.require_store(), webhook_id):
        raise ApiError(404, "not_found", f"no webhook {webhook_id!r}", field="webhookId")
    _changed("deleted", webhook)
    return Response(status_code=204)


@router.post(
    "/webhooks/{webhookId}/rotate-secret",
    response_model=WebhookCreated,
    responses=errors_documented(401, 403, 404, 415, 422, 503),
    dependencies=[_takes_query()],
)
async def rotate_webhook_secret(
    state: State, caller: Caller, webhook_id: WebhookId
) -> JSONResponse:
    """A new signing secret, shown this once: every post from now on (retries of earlier
    deliveries too) is signed with it, and the old one verifies none."""
    require_scope(caller, JOBS_READ)
    require_scope(caller, JOBS_WRITE)
    await _visible(state, caller, webhook_id)
    rotated = await hooks.rotate_secret(state.require_store(), webhook_id)
    if rotated is None:
        raise ApiError(404, "not_found", f"no webhook {webhook_id!r}", field="webhookId")
    webhook, secret = rotated
    _changed("secret_rotated", webhook)
    return JSONResponse({"webhook": _view(webhook), "secret": secret})


@router.post(
    "/webhooks/{webhookId}/test",
    response_model=WebhookTestAccepted,
    status_code=202,
    responses=errors_documented(401, 403, 404, 415, 422, 429, 503),
    dependencies=[_takes_query()],
)
async def test_webhook(state: State, caller: Caller, webhook_id: WebhookId) -> JSONResponse:
    """Owe the subscription a `webhook.test` event (202), delivered through the same outbox,
    signing and retries as every other. Each takes one of the organization's enqueue tokens
    (`RECEIPT_ORG_ENQUEUE_RATE`, 429): a test is work for the deliverer as a job is."""
    require_scope(caller, JOBS_WRITE)
    webhook = await _visible(state, caller, webhook_id)
    await state.org_limits.admit_paced(webhook.organization_id)
    delivery_id = await hooks.send_test(state.require_store(), webhook)
    _changed("tested", webhook, deliveryId=str(delivery_id))
    # Not the sequence's id: its gaps would count other organizations' deliveries.
    shown = str(webhook_ids.shown(webhook.delivery_key, delivery_id))
    return JSONResponse({"webhookId": webhook.webhook_id, "deliveryId": shown}, status_code=202)


@router.get(
    "/webhooks/{webhookId}/deliveries",
    response_model=WebhookDeliveryList,
    responses=errors_documented(401, 403, 404, 422, 503),
    dependencies=[_takes_query("limit", "cursor")],
)
async def list_webhook_deliveries(
    state: State,
    caller: Caller,
    webhook_id: WebhookId,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=1000)] = None,
) -> JSONResponse:
    """The subscription's deliveries, newest first: each one's status, tries (status code or
    error, when), the next try of a pending one."""
    require_scope(caller, JOBS_READ)
    webhook = await _visible(state, caller, webhook_id)
    after = decode_cursor(cursor)
    after_id: int | None = None
    if after is not None:
        # A delivery id as shown (webhook_ids.py): ASCII digits only (`str.isdigit` takes `²`,
        # which `int` refuses) within the permuted range, or the read is a 500.
        key = after.key
        if not (key.isascii() and key.isdigit() and len(key) <= 19 and int(key) < SHOWN_LIMIT):
            raise InvalidInput("cursor", "cursor is not one this API returned")
        after_id = webhook_ids.stored(webhook.delivery_key, int(after.key))
    items, more = await hooks.deliveries_page(state.require_store(), webhook_id, after_id, limit)
    for item in items:
        item["deliveryId"] = str(webhook_ids.shown(webhook.delivery_key, int(item["deliveryId"])))
    if not caller.admin:
        items = untagged(items, webhook.organization_id)
    # A delivery keeps every try (up to RECEIPT_WEBHOOK_MAX_TRIES, each with its error): a
    # page of 200 failed ones was 8 MB. The page ends at RECEIPT_MAX_RESPONSE_BYTES, as the
    # other lists do, and its cursor goes on after the last one shown.
    shown = within_budget(items, state.settings.max_response_bytes)
    last = last_shown(items, len(shown), more)
    next_cursor = (
        encode_cursor(datetime.fromisoformat(last["createdAt"]), last["deliveryId"])
        if last
        else None
    )
    return JSONResponse({"deliveries": shown, "nextCursor": next_cursor})
