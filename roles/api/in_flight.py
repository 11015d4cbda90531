"""The requests of one organization the api works on at once: past
`RECEIPT_ORG_REQUESTS_IN_FLIGHT` its next one is refused (429 with `Retry-After`), counted
(`receipt_api_limited_total{limit="in_flight"}`) and logged once per interval.

A pure ASGI middleware inside the enqueue gate (roles/api/gate.py): an enqueue the gate answers
itself, bounded by the organization's rate, is not counted here and costs what it did. Every
other request with an organization's bearer token counts against its organization, one of a
console session cookie against its session, from its arrival until its answer starts: the part
that holds the database (an event stream's slot is given back when it starts streaming; the
streams have their own caps). An admin's token and an API running open are the operator's own:
not counted.

Why: every request shares the api's event loop and its pool of database connections (20).
Unbounded, 200 concurrent job lists of one organization with a filter that matches none of its
million jobs took another organization's `GET /jobs/{id}` from 10 to 7 152 ms and its enqueue
from 8 ms to 41 s.
"""

from __future__ import annotations

import hashlib
import logging

from starlette.datastructures import Headers
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from receipts import metrics
from roles.api.auth import AUTHENTICATED, TokenTable
from roles.api.console.session import COOKIE
from roles.api.errors import error_response, too_many
from roles.api.limits import SSE_RETRY_MS, InFlight, refusals

log = logging.getLogger("roles.api.app")


def counted_as(tokens: TokenTable, headers: Headers, state: dict[str, object]) -> str | None:
    """Whose requests in flight `headers`' request counts in: its bearer token's organization,
    else its console session's cookie; None for an admin's, an unknown token's (401, no
    database) or an API running open. A token it authenticates is kept in `state` (the
    request's, `AUTHENTICATED`)."""
    if tokens.open:
        return None
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        principal = tokens.authenticate(token.strip())
        if principal is not None:
            state[AUTHENTICATED] = principal
        if principal is None or principal.admin or principal.organization_id is None:
            return None
        return principal.organization_id
    session = cookie_parser(headers.get("cookie", "")).get(COOKIE)
    # Named by a digest: the key is logged (`api.in_flight_limited`), the cookie is a secret.
    return f"{COOKIE}:{hashlib.sha256(session.encode()).hexdigest()[:16]}" if session else None


class InFlightGate:
    """Refuse a request past its organization's requests in flight; count the others until
    their answer starts."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope["app"].state.api
        in_flight: InFlight = state.in_flight
        key = counted_as(state.tokens, Headers(scope=scope), scope.setdefault("state", {}))
        if key is None:
            await self.app(scope, receive, send)
            return
        if not in_flight.take(key):
            metrics.API_LIMITED.labels("in_flight").inc()
            if (unlogged := refusals.due("in_flight", key)) is not None:
                log.warning(
                    "request refused: the organization's requests in flight",
                    extra={
                        "event": "api.in_flight_limited",
                        "organizationId": key,
                        "unloggedSince": unlogged,
                    },
                )
            refused = too_many(
                f"the organization already has {in_flight.per_org} requests in flight "
                "(RECEIPT_ORG_REQUESTS_IN_FLIGHT)",
                SSE_RETRY_MS / 1000,
            )
            await error_response(refused)(scope, receive, send)
            return
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                in_flight.give(key)

        async def send_released(message: Message) -> None:
            if message["type"] == "http.response.start":
                release()
            await send(message)

        try:
            await self.app(scope, receive, send_released)
        finally:
            release()
