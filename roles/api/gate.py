"""The enqueue gate: an enqueue over its organization's rate is refused before the framework
routes, resolves dependencies or reads the body, and a well-formed enqueue is answered without
them.

A pure ASGI middleware in front of `POST /agents/{agentId}/jobs` (an app served under a root
path leaves every request to the router). It authenticates the bearer token (one SHA-256 and a
dict lookup), and for a token that may enqueue (`jobs:write`) with a body not declared over
`RECEIPT_MAX_BODY_BYTES`, it takes one of the organization's tokens
(roles/api/limits.py `OrgLimits`): none left, it answers the 429 itself, in the API's one error
shape with `Retry-After`; else it marks the request admitted and the route does not take again.
An API running open takes no token here: the enqueue's own checks (Host, Origin) come first.

Then, for a post whose path, `Idempotency-Key` and (absent) query the route's parameters would
accept, it answers the enqueue itself (`serve`: roles/api/routes/jobs.py `enqueue_front`, the
route's own code) and turns the failures a route raises on purpose into the same answers the
app's handlers give (roles/api/errors.py `known_answer`). Everything else (no token, an unknown
one, a missing scope, a body declared too large, a path or header the route refuses, a query)
passes through to the route, which answers as it always has.

Why: a tenant flooding past its rate costs the one api process a full route per refusal
(routing, dependencies, the error handler): measured by `make chaos`'s hostile tenant, 45 000
refusals in 120 s put another organization's enqueue p99 at 4.5x its quiet value. Refused here,
a refusal costs a fraction of that. And the router and the dependencies were a fifth of an
admitted enqueue's CPU in the api (tools/bench/README.md, "The api's enqueue").
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from types import SimpleNamespace

from fastapi.telemetry._api import _route_selected
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from receipts.enqueue import JOB_ID_PATTERN
from receipts.errors import InvalidInput
from receipts.kinds import MAX_ID_LENGTH, NON_BLANK
from receipts.text import check_clean_text
from roles.api.auth import JOBS_WRITE, Principal
from roles.api.body import declared_length
from roles.api.errors import KNOWN_FAILURES, ApiError, error_response, known_answer
from roles.api.limits import CALLER

ENQUEUE_PATH = re.compile(r"^/agents/[^/]+/jobs$")
ADMITTED = "enqueue_admitted"
"""The request state's key of the principal the gate authenticated and took this enqueue's
token for: the route takes no second token and the caller is not authenticated twice."""
# What the request metrics read as the answering route (roles/api/request_metrics.py).
ENQUEUE_ROUTE = SimpleNamespace(path_format="/agents/{agentId}/jobs")
_NON_BLANK = re.compile(NON_BLANK)
_JOB_ID = re.compile(JOB_ID_PATTERN)

Serve = Callable[[Request, str, str | None], Awaitable[Response]]
"""The enqueue's answer for (request, agentId, Idempotency-Key) the gate found well-formed."""


def admitted(request: Request) -> Principal | None:
    """The principal the gate authenticated and took `request`'s enqueue token for, if it did."""
    principal = getattr(request.state, ADMITTED, None)
    return principal if isinstance(principal, Principal) else None


def well_formed(scope: Scope, headers: Headers) -> tuple[str, str | None] | None:
    """The post's `agentId` and `Idempotency-Key` when the route's parameters would take them as
    they are (an id of at most `MAX_ID_LENGTH` characters, not blank, clean text; a key matching
    `JOB_ID_PATTERN`; no query, which the route refuses); None when the route must answer."""
    if scope["query_string"]:
        return None
    agent_id = scope["path"].split("/")[2]
    if len(agent_id) > MAX_ID_LENGTH or not _NON_BLANK.search(agent_id):
        return None
    try:
        check_clean_text(agent_id, "agentId")
    except InvalidInput:
        return None
    key = headers.get("idempotency-key")
    if key is not None and not _JOB_ID.fullmatch(key):  # `$` alone would let "k\n" through
        return None
    return agent_id, key


class EnqueueGate:
    """Refuse an enqueue over its organization's rate before the app routes it; answer a
    well-formed one through `serve`."""

    def __init__(self, app: ASGIApp, serve: Serve) -> None:
        self.app = app
        self.serve = serve

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope.get("root_path")  # the router matches what is left of the path: its call
            or not ENQUEUE_PATH.match(scope["path"])
        ):
            await self.app(scope, receive, send)
            return
        state = scope["app"].state.api
        # One request for the gate and the enqueue it serves: its headers are parsed once.
        request = Request(scope, receive)
        headers = request.headers
        if not state.tokens.open:
            scheme, _, token = headers.get("authorization", "").partition(" ")
            principal = (
                state.tokens.authenticate(token.strip()) if scheme.lower() == "bearer" else None
            )
            length = declared_length(headers.get("content-length"))
            too_large = length is not None and length > state.settings.max_body_bytes
            if principal is None or not principal.can(JOBS_WRITE) or too_large:
                await self.app(scope, receive, send)
                return
            try:
                await state.org_limits.admit_paced(principal.organization_id)
            except ApiError as refused:
                _route_matched(scope)
                await error_response(refused)(scope, receive, send)
                return
            scope.setdefault("state", {}).update({ADMITTED: principal, CALLER: principal})
        parameters = well_formed(scope, headers)
        if parameters is None:
            await self.app(scope, receive, send)
            return
        _route_matched(scope)
        try:
            response = await self.serve(request, *parameters)
        except KNOWN_FAILURES as failure:
            response = known_answer(failure, request)
        await response(scope, receive, send)


def _route_matched(scope: Scope) -> None:
    """What the router records of the route it hands a request to: its template, for the request
    metrics (roles/api/request_metrics.py) and for FastAPI's request span (`POST
    /agents/{agentId}/jobs`, pinned by tests/e2e/test_job_trace.py)."""
    scope["route"] = ENQUEUE_ROUTE
    _route_selected(scope=scope, path=ENQUEUE_ROUTE.path_format)
