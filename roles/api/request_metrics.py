"""The api's request metrics: every answer counted by route template, method and status, and timed.

A pure ASGI middleware (no BaseHTTPMiddleware: event streams pass through unbuffered). The
route label is the matched route's template (`/agents/{agentId}/jobs`), read from the scope
Starlette's router fills in, never the raw path: a path carries ids, and each distinct label
value is a new series on every scrape. A request no route matched is `unmatched`; a method
outside HTTP's own is `other`. The families live in receipts/metrics.py.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from receipts import metrics

UNMATCHED = "unmatched"
OTHER_METHOD = "other"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def route_template(scope: Scope) -> str:
    """The template of the route that answered `scope` as the OpenAPI document spells it
    (`/jobs/{jobId}`), a mount's prefix for the files it serves (`/docs/assets`), or
    `unmatched`."""
    route = scope.get("route")
    template = getattr(route, "path_format", None)
    if isinstance(template, str) and template:
        return template
    if "endpoint" in scope:  # a mounted app (static files): the router set its prefix
        prefix = str(scope.get("root_path", ""))[len(str(scope.get("app_root_path", ""))) :]
        if prefix:
            return prefix
    return UNMATCHED


class RequestMetrics:
    """Count and time each HTTP request the wrapped app answers (`receipt_api_requests_total`,
    `receipt_api_request_duration_seconds`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the server answers if the app raises before it starts an answer

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            method = scope["method"] if scope["method"] in METHODS else OTHER_METHOD
            route = route_template(scope)
            metrics.API_REQUESTS.labels(route, method, str(status)).inc()
            if status != 429:  # a refusal over the rate is held (roles/api/limits.py): no latency
                metrics.API_REQUEST_DURATION.labels(route, method).observe(
                    time.perf_counter() - started
                )
