"""What every routes module imports: the shared state, the FastAPI dependency aliases (`State`,
`Caller`, `JobId`), scope checks, and the error type and body readers.

A new resource (objectives, agent jobs) adds `roles/api/routes/<resource>.py` exposing an
`APIRouter` named `router`, written against this module only; `create_app` includes it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from receipts import reads
from receipts.agent_jobs.registry import AgentJobSettings
from receipts.enqueue_batch import EnqueueBatcher
from receipts.errors import InvalidInput, TransientStorageError
from receipts.jobs import Job
from receipts.listen import Listener
from receipts.settings import Settings
from receipts.store import Store
from receipts.tenancy import untagged
from receipts.text import check_clean_text
from receipts.webhooks import WebhookSettings
from roles.api.auth import OPEN, Principal, TokenTable, authenticated, is_loopback
from roles.api.body import JsonLimits, json_object, read_json_body, validated
from roles.api.errors import ApiError, too_many
from roles.api.gate import admitted
from roles.api.limits import (
    CALLER,
    SESSIONS_BURST,
    SESSIONS_PER_S,
    BodyBytes,
    InFlight,
    OrgLimits,
    StreamGate,
)
from roles.api.schema import shown_job_id
from roles.api.settings import ApiSettings

__all__ = [
    "ApiError",
    "ApiState",
    "Caller",
    "InvalidInput",
    "JobId",
    "State",
    "json_object",
    "read_json_body",
    "request_caller",
    "require_scope",
    "takes_query",
    "too_many",
    "validated",
    "visible_job",
]


@dataclass
class ApiState:
    """What the routes share: the settings of the concerns they use (the api's own, the shared
    core, the agent jobs'), tokens, limits, and (between start and stop) store and listener."""

    settings: ApiSettings
    tokens: TokenTable
    database_url: str | None
    store: Store | None = None
    enqueuer: EnqueueBatcher | None = None
    """The group commit of new jobs over `store` (receipts/enqueue_batch.py), while it is open."""
    listener: Listener | None = None
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    # Set at SIGTERM: /readyz answers 503 while the api still serves (its drain delay).
    draining: asyncio.Event = field(default_factory=asyncio.Event)
    core: Settings = field(default_factory=Settings)
    agent_jobs: AgentJobSettings = field(default_factory=AgentJobSettings)
    webhooks: WebhookSettings = field(default_factory=WebhookSettings)
    streams: StreamGate = field(init=False)
    org_limits: OrgLimits = field(init=False)
    bodies: BodyBytes = field(init=False)
    in_flight: InFlight = field(init=False)
    # Console sessions made, per token (roles/api/console/session.py `check_new_session`).
    sessions_made: OrgLimits = field(
        default_factory=lambda: OrgLimits(SESSIONS_PER_S, SESSIONS_BURST)
    )

    def __post_init__(self) -> None:
        s = self.settings
        self.streams = StreamGate(s.sse_max_streams, s.sse_max_streams_per_token)
        self.org_limits = OrgLimits(
            s.org_enqueue_rate,
            s.org_enqueue_burst,
            hold_s=s.rate_refusal_hold_ms / 1000,
            max_held=s.rate_refusals_held_max,
        )
        self.bodies = BodyBytes(s.org_body_bytes_in_flight)
        self.in_flight = InFlight(s.org_requests_in_flight)

    @property
    def json_limits(self) -> JsonLimits:
        s = self.settings
        return JsonLimits(s.max_json_depth, s.max_json_nodes, s.max_json_key_chars)

    def require_store(self) -> Store:
        if self.store is None:
            raise TransientStorageError("the store is not open")
        return self.store

    def require_enqueuer(self) -> EnqueueBatcher:
        if self.enqueuer is None:
            raise TransientStorageError("the store is not open")
        return self.enqueuer


# The route dependencies are `async def` although they never await: FastAPI runs a sync
# dependency in its thread pool, a thread hop per dependency per request (+40 % req/s at one
# client in `make bench` without them).
async def _state(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state


_bearer = HTTPBearer(auto_error=False, description="A token from RECEIPT_API_TOKENS(_FILE)")


def _host_name(host: str) -> str:
    """The name part of a `Host` header (`[::1]:8000` → `::1`, `localhost:8000` → `localhost`)."""
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _origin_host(origin: str) -> str | None:
    scheme, sep, rest = origin.partition("://")
    if not sep or scheme not in ("http", "https"):
        return None
    return _host_name(rest.split("/", 1)[0])


def check_open_request(request: Request, *, json_body: bool = True) -> None:
    """In open mode (no tokens), refuse what a web page could send (README, "Open mode and `receipt up`").

    The caller of an open API is admin, so a page in the operator's browser must not be able to
    reach it: the `Host` must be a loopback name (DNS rebinding points a foreign name at
    127.0.0.1), an `Origin` other than a loopback one is refused, and a post must be declared
    `application/json`, a body or none (a cross-origin `text/plain` or bodyless POST needs no
    CORS preflight; the console's forms, which carry a CSRF token instead, pass
    `json_body=False`).
    """
    host = request.headers.get("host", "")
    if not is_loopback(_host_name(host)):
        raise ApiError(
            403,
            "forbidden",
            "the API runs without tokens and answers only requests addressed to a loopback "
            "host (set RECEIPT_API_TOKENS to serve other names)",
            field="Host",
        )
    origin = request.headers.get("origin")
    if origin is not None:
        origin_host = _origin_host(origin)
        if origin_host is None or not is_loopback(origin_host):
            raise ApiError(
                403,
                "forbidden",
                "the API runs without tokens and refuses requests from other origins",
                field="Origin",
            )
    if json_body and request.method in ("POST", "PUT", "PATCH"):
        media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media != "application/json":
            raise ApiError(
                415,
                "unsupported_media_type",
                "request bodies must be application/json",
                field="Content-Type",
            )


def request_caller(request: Request, token: str | None) -> Principal:
    """Who sent `request`, with the bearer `token` it carries (None: none): the principal the
    enqueue gate authenticated, the open API's admin (after `check_open_request`), or the
    token's; 401 for a missing or unknown token."""
    if (principal := admitted(request)) is not None:
        return principal  # the enqueue gate authenticated this request already
    state: ApiState = request.app.state.api
    tokens = state.tokens
    if tokens.open:
        check_open_request(request)
        setattr(request.state, CALLER, OPEN)
        return OPEN
    challenge = {"WWW-Authenticate": "Bearer"}
    if token is None:
        raise ApiError(401, "unauthorized", "a bearer token is required", headers=challenge)
    # The in-flight gate authenticated this token already (roles/api/in_flight.py).
    principal = authenticated(request.state) or tokens.authenticate(token)
    if principal is None:
        raise ApiError(401, "unauthorized", "unknown bearer token", headers=challenge)
    setattr(request.state, CALLER, principal)
    return principal


async def _caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    return request_caller(request, credentials.credentials if credentials else None)


def require_scope(caller: Principal, scope: str) -> None:
    """403 unless the caller's token holds `scope`."""
    if not caller.can(scope):
        raise ApiError(403, "forbidden", f"this token lacks the {scope!r} scope")


Caller = Annotated[Principal, Depends(_caller)]
State = Annotated[ApiState, Depends(_state)]
JobId = Annotated[str, Path(alias="jobId", description="The job id")]


async def clean_params(request: Request) -> None:
    """Refuse NUL in path and query parameters (it cannot reach PostgreSQL text)."""
    for name, value in request.path_params.items():
        check_clean_text(value, name)
    for name, value in request.query_params.multi_items():
        check_clean_text(value, name)


def takes_query(*names: str) -> Any:
    """A route dependency refusing query parameters other than `names` (a typo would silently
    not filter)."""

    async def check(request: Request) -> None:
        for name in request.query_params:
            if name not in names:
                raise InvalidInput(name or "query", f"unknown query parameter {name!r}", names)

    return Depends(check)


async def find_job(store: Store, caller: Principal, job_id: str) -> Job | None:
    """The job `caller` names `job_id`, when it may see it; None otherwise
    (`receipts.reads.visible_job`; 409 `ambiguous_job_id` for an admin's id that several
    organizations use)."""
    try:
        return await reads.visible_job(store, caller, job_id)
    except reads.AmbiguousJobId as exc:
        raise ApiError(409, "ambiguous_job_id", str(exc), field="jobId") from None


async def visible_job(state: ApiState, caller: Principal, job_id: str) -> Job:
    """The job the caller names `job_id` (see `find_job`); 404 when there is none it may see
    (another organization's job answers exactly as an unknown one)."""
    job = await find_job(state.require_store(), caller, job_id)
    if job is None:
        raise ApiError(404, "not_found", f"no job {job_id!r}", field="jobId")
    return job


def shown_view(caller: Principal, view: Any) -> Any:
    """A view as the caller sees it: an organization's ids without the runtime's tag."""
    if caller.admin or caller.organization_id is None:
        return view
    return untagged(view, caller.organization_id)


def shown_id(caller: Principal, job: Job) -> str:
    """The id the caller knows `job` by."""
    return shown_job_id(job, None if caller.admin else caller.organization_id)
