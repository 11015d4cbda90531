# Over 400 lines: app, errors, bodies, SSE and routes together until the api package split lands.
"""The api role: the HTTP API over the receipt store (FastAPI), served by uvicorn.

Every error answers one JSON shape, `{"error": {"code", "message", "field"?, "allowed"?}}`, and
writes nothing. A database outage answers 503 with `Retry-After`; anything else that escapes a
route is a bug and answers 500 (logged).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import json
import logging
import math
import signal
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path as FilePath
from typing import Annotated, Any, Protocol
from urllib.parse import quote

import uvicorn
from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from opentelemetry import trace
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from pydantic import Field
from pydantic.json_schema import models_json_schema
from pydantic_settings import BaseSettings, SettingsConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException

from receipts import jobs as jobmodel
from receipts import operations
from receipts.enqueue import MAX_ID_LENGTH, enqueue, parse_enqueue
from receipts.errors import ConflictError, InvalidInput, StorageError, TransientStorageError
from receipts.jobs import COMMAND_TYPES, LANES, STATUSES, Job, Receipt
from receipts.kinds import AGENT_IDS, KINDS
from receipts.listen import RECONNECTED, Listener, Notice
from receipts.sql import migrations, query
from receipts.store import Store, translate_errors
from receipts.text import check_clean_text
from roles.api.auth import OPEN, Principal, TokenTable, check_open_bind, load_tokens
from roles.api.docs import install_docs
from roles.api.schema import (
    NON_BLANK,
    CommandAccepted,
    CommandBody,
    EnqueueAccepted,
    EnqueueBody,
    EventsPage,
    Health,
    JobList,
    JobView,
    Ready,
    errors_documented,
    job_view,
    json_body_documented,
)
from roles.infra.tracing import current_traceparent, trace_id_of
from roles.infra.tracing import recording as tracing_recording

log = logging.getLogger("roles.api.app")
_tracer = trace.get_tracer("receipt.api")

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
RETRY_AFTER_S = 5
MAX_JSON_DEPTH = 64
SSE_KEEPALIVE_S = 15.0
SSE_RETRY_MS = 1000
SSE_PAGE = 1000
READY_TIMEOUT_S = 3.0
COMMAND_CONFLICT_RETRIES = 3
ENQUEUE_FIELDS: tuple[str, ...] = (
    "jobId",
    "lane",
    "sessionKey",
    "singletonMode",
    "maxAttempts",
    "delayMs",
    "payload",
)
COMMAND_FIELDS: tuple[str, ...] = ("type", "payload", "reason")
LIST_QUERY: tuple[str, ...] = (
    "status",
    "agentId",
    "lane",
    "sessionKey",
    "kind",
    "organizationId",
    "limit",
    "cursor",
)


class ApiSettings(BaseSettings):
    """Settings of the api role; each field reads the environment variable in its alias."""

    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True)

    host: str = Field(default="127.0.0.1", alias="RECEIPT_API_HOST")
    port: int = Field(default=8000, ge=0, le=65535, alias="RECEIPT_API_PORT")
    max_body_bytes: int = Field(
        default=DEFAULT_MAX_BODY_BYTES, ge=1, alias="RECEIPT_MAX_BODY_BYTES"
    )
    tokens_file: FilePath | None = Field(default=None, alias="RECEIPT_API_TOKENS_FILE")
    tokens: str | None = Field(default=None, alias="RECEIPT_API_TOKENS")
    strict_agent_ids: bool = Field(default=False, alias="RECEIPT_STRICT_AGENT_IDS")
    sse_keepalive_ms: int = Field(
        default=int(SSE_KEEPALIVE_S * 1000), ge=100, alias="RECEIPT_SSE_KEEPALIVE_MS"
    )


# --- errors -------------------------------------------------------------------------------


class ApiError(Exception):
    """An answer other than success: an HTTP status and the one JSON error shape."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field: str | None = None,
        allowed: list[str] | tuple[str, ...] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.allowed = list(allowed) if allowed is not None else None
        self.headers = dict(headers or {})


def error_response(error: ApiError) -> JSONResponse:
    """Return the JSON response of an error: `{"error": {code, message, field?, allowed?}}`."""
    body: dict[str, Any] = {"code": error.code, "message": error.message}
    if error.field is not None:
        body["field"] = error.field
    if error.allowed is not None:
        body["allowed"] = error.allowed
    return JSONResponse({"error": body}, status_code=error.status, headers=error.headers)


_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "body_too_large",
    415: "unsupported_media_type",
    422: "invalid_input",
    503: "storage_unavailable",
}


def _field_of(location: Sequence[Any]) -> str:
    parts = [str(p) for p in location]
    if parts and parts[0] in ("query", "path", "header", "body"):
        parts = parts[1:]
    return ".".join(parts) or "request"


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(InvalidInput)
    async def invalid_input(request: Request, exc: InvalidInput) -> JSONResponse:
        return error_response(
            ApiError(422, "invalid_input", exc.message, field=exc.field, allowed=exc.allowed)
        )

    @app.exception_handler(ConflictError)
    async def conflict(request: Request, exc: ConflictError) -> JSONResponse:
        # DESIGN §4: a jobId owned by another organization answers 409 with no detail.
        return error_response(ApiError(409, "conflict", "jobId already in use"))

    @app.exception_handler(TransientStorageError)
    async def outage(request: Request, exc: TransientStorageError) -> JSONResponse:
        log.warning(
            "database unavailable",
            extra={"event": "api.storage_unavailable", "path": request.url.path, "error": str(exc)},
        )
        return error_response(
            ApiError(
                503,
                "storage_unavailable",
                "the database is unavailable; retry later",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        )

    @app.exception_handler(RequestValidationError)
    async def validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        name = _field_of(first.get("loc", ()))
        return error_response(
            ApiError(422, "invalid_input", f"{name}: {first.get('msg')}", field=name)
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _STATUS_CODES.get(exc.status_code, "error")
        message = exc.detail if isinstance(exc.detail, str) else code
        return error_response(ApiError(exc.status_code, code, message, headers=exc.headers))

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:
        # A bug, not an outage: logged with its traceback, answered 500, re-raised by Starlette.
        log.error(
            "unhandled error",
            exc_info=exc,
            extra={"event": "api.unhandled", "path": request.url.path},
        )
        return error_response(ApiError(500, "internal", "internal error"))


# --- request helpers ------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


def _depth_exceeds(value: Any, limit: int) -> bool:
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children)
    return False


async def read_json_body(request: Request, limit: int) -> Any:
    """Read and decode the JSON body, refusing it before anything else looks at it.

    413 when `Content-Length` or the bytes actually received exceed `limit`; 400 when it is
    not UTF-8 JSON (NaN and infinities included); 422 when it nests deeper than
    `MAX_JSON_DEPTH` or any string or key holds NUL or a lone surrogate (`json.loads` accepts
    `"\\ud800"`; PostgreSQL would not).
    """
    too_large = ApiError(
        413, "body_too_large", f"the request body exceeds {limit} bytes (RECEIPT_MAX_BODY_BYTES)"
    )
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise ApiError(400, "malformed_json", "Content-Length is not a number")
        if int(declared) > limit:
            raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        raise ApiError(400, "malformed_json", "the request body must be a JSON document")
    try:
        body = json.loads(
            raw.decode("utf-8"), parse_constant=_reject_constant, parse_float=_finite_float
        )
    except UnicodeDecodeError as exc:
        raise ApiError(400, "malformed_json", "the request body is not UTF-8") from exc
    except RecursionError as exc:
        raise ApiError(400, "malformed_json", "the JSON body nests too deeply") from exc
    except ValueError as exc:
        raise ApiError(400, "malformed_json", f"malformed JSON: {exc}") from exc
    if _depth_exceeds(body, MAX_JSON_DEPTH):
        raise InvalidInput("body", f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels")
    check_clean_text(body, "")
    return body


def _object(body: Any, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidInput("body", "the request body must be a JSON object")
    unknown = [name for name in body if name not in allowed]
    if unknown:
        raise InvalidInput(unknown[0], f"unknown field {unknown[0]!r}", allowed)
    return body


def _choice(value: str | None, name: str, allowed: tuple[str, ...]) -> str | None:
    if value is not None and value not in allowed:
        raise InvalidInput(name, f"{name} must be one of: {', '.join(allowed)}", allowed)
    return value


def _job_path(request: Request, job_id: str, suffix: str = "") -> str:
    root = request.scope.get("root_path", "")
    return f"{root}/jobs/{quote(job_id, safe='')}{suffix}"


def encode_cursor(job: Job) -> str:
    """Return the opaque cursor that continues a list after `job` (newest first)."""
    raw = json.dumps([job.created_at.isoformat(), job.job_id], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """Return `(created_at, job_id)` of a cursor; raise `InvalidInput` for anything else."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, job_id = json.loads(raw)
        at = datetime.fromisoformat(created_at)
        if not isinstance(job_id, str) or at.tzinfo is None:
            raise ValueError(cursor)
        check_clean_text(job_id, "cursor")
    except (InvalidInput, ValueError, TypeError, binascii.Error, OverflowError) as exc:
        raise InvalidInput("cursor", "cursor is not one this API returned") from exc
    return at, job_id


# --- state, authentication ------------------------------------------------------------------


class EnqueueObserver(Protocol):
    """Told of every accepted enqueue (the role's metrics)."""

    def job_enqueued(self, job: Job, outcome: str) -> None: ...


@dataclass
class ApiState:
    """What the routes share: settings, tokens, and (between start and stop) store and listener."""

    settings: ApiSettings
    tokens: TokenTable
    database_url: str | None
    store: Store | None = None
    listener: Listener | None = None
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    metrics: EnqueueObserver | None = None

    def require_store(self) -> Store:
        if self.store is None:
            raise TransientStorageError("the store is not open")
        return self.store


# The route dependencies are `async def` although they never await: FastAPI runs a sync
# dependency in its thread pool, a thread hop per dependency per request (+40 % req/s at one
# client in `make bench` without them).
async def _state(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state


_bearer = HTTPBearer(auto_error=False, description="A token from RECEIPT_API_TOKENS(_FILE)")


async def _caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    state: ApiState = request.app.state.api
    tokens = state.tokens
    if tokens.open:
        return OPEN
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None:
        raise ApiError(401, "unauthorized", "a bearer token is required", headers=challenge)
    principal = tokens.authenticate(credentials.credentials)
    if principal is None:
        raise ApiError(401, "unauthorized", "unknown bearer token", headers=challenge)
    return principal


Caller = Annotated[Principal, Depends(_caller)]
State = Annotated[ApiState, Depends(_state)]
JobId = Annotated[str, Path(alias="jobId", description="The job id")]


async def _clean_params(request: Request) -> None:
    """Refuse NUL in path and query parameters (it cannot reach PostgreSQL text)."""
    for name, value in request.path_params.items():
        check_clean_text(value, name)
    for name, value in request.query_params.multi_items():
        check_clean_text(value, name)


def _takes_query(*names: str) -> Any:
    """A route dependency refusing query parameters other than `names` (a typo would silently
    not filter)."""

    async def check(request: Request) -> None:
        for name in request.query_params:
            if name not in names:
                raise InvalidInput(name or "query", f"unknown query parameter {name!r}", names)

    return Depends(check)


async def _visible_job(state: ApiState, caller: Principal, job_id: str) -> Job:
    job = await state.require_store().get_job(job_id)
    if job is None or not caller.sees(job.organization_id):
        raise ApiError(404, "not_found", f"no job {job_id!r}", field="jobId")
    return job


# --- server-sent events ---------------------------------------------------------------------


def sse_receipt(receipt: Receipt) -> str:
    """Return one receipt as an SSE event; its `id` is the receipt's seq."""
    return f"id: {receipt.seq}\ndata: {json.dumps(receipt.to_json(), separators=(',', ':'))}\n\n"


def sse_end(job: Job) -> str:
    """Return the closing event, sent after the receipt that made the job terminal."""
    data = json.dumps({"jobId": job.job_id, "status": job.status}, separators=(",", ":"))
    return f"event: end\ndata: {data}\n\n"


async def receipt_events(
    store: Store,
    listener: Listener,
    stopping: asyncio.Event,
    job_id: str,
    after: int,
    keepalive_s: float = SSE_KEEPALIVE_S,
) -> AsyncIterator[str]:
    """Yield a job's receipts with `seq > after` as SSE events, live, until it is terminal.

    The subscription opens before the backlog is read, so no append falls between the two;
    the state is folded from seq 1 (to know when the job turns terminal) and only receipts past
    `after` are sent, each once, in order. A notice for the stream or a `RECONNECTED` marker
    triggers a re-read from the last seq seen; the database is never polled. The stream ends
    after the terminal receipt, when the server stops, or when the database is lost (a client
    then reconnects with `Last-Event-ID`).
    """
    stream = jobmodel.job_stream(job_id)
    state: Job | None = None
    folded = 0
    async with listener.subscribe() as notices:
        yield f"retry: {SSE_RETRY_MS}\n\n"
        stop = asyncio.ensure_future(stopping.wait())
        try:
            while True:
                try:
                    batch = await store.read_stream(stream, folded, SSE_PAGE)
                except TransientStorageError as exc:
                    log.warning(
                        "event stream lost the database",
                        extra={"event": "api.sse_storage_lost", "jobId": job_id, "error": str(exc)},
                    )
                    return
                for receipt in batch:
                    state = jobmodel.apply(state, receipt)
                    folded = receipt.seq
                    if receipt.seq > after:
                        yield sse_receipt(receipt)
                        if state is not None and state.terminal:
                            yield sse_end(state)
                            return
                if len(batch) == SSE_PAGE:
                    continue
                if state is not None and state.terminal:
                    yield sse_end(state)
                    return
                while True:
                    notice = await _next_notice(notices, stop, keepalive_s)
                    if notice is None:
                        yield ": keepalive\n\n"
                    elif notice is _STOP:
                        return
                    elif notice is RECONNECTED or (notice.stream == stream and notice.seq > folded):
                        break
        finally:
            stop.cancel()


_STOP = Notice("", -1, ())


async def _next_notice(
    notices: asyncio.Queue[Notice], stop: asyncio.Future[Any], keepalive_s: float
) -> Notice | None:
    """Return the next notice, `_STOP` once the server stops, or None after the keepalive period."""
    get = asyncio.ensure_future(notices.get())
    try:
        done, _ = await asyncio.wait(
            {get, stop}, timeout=keepalive_s, return_when="FIRST_COMPLETED"
        )
    finally:
        if not get.done():
            get.cancel()
    if get in done:
        return get.result()
    if stop in done:
        return _STOP
    return None


# --- the app --------------------------------------------------------------------------------


async def _schema_ready(store: Store) -> int:
    """Return the schema version when every shipped migration is applied; raise ApiError if not."""
    with translate_errors():
        async with store.pool.connection() as conn:
            cur = await conn.execute(query("migrations_applied"), {})
            applied = {row[0] for row in await cur.fetchall()}
    missing = sorted({m.version for m in migrations()} - applied)
    if missing:
        raise ApiError(
            503,
            "not_migrated",
            f"migrations not applied: {missing}; run `receipt migrate`",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    return max(applied)


async def _list_jobs(store: Store, params: dict[str, Any]) -> list[Job]:
    with translate_errors():
        async with store.pool.connection() as conn:
            cur = await conn.execute(query("api_list_jobs"), params)
            return [Job.model_validate(row[0]) for row in await cur.fetchall()]


def create_app(
    settings: ApiSettings | None = None,
    *,
    database_url: str | None = None,
    store: Store | None = None,
    listener: Listener | None = None,
    metrics: EnqueueObserver | None = None,
) -> FastAPI:
    """Build the API.

    The lifespan opens a `Store` on `database_url` and runs a `Listener` for event streams,
    unless the caller passes its own `store` / running `listener` (it then owns them). Raises
    `TokenConfigError` when the tokens cannot be read, or when none are configured and the bind
    is not loopback.
    """
    settings = settings or ApiSettings()
    tokens = load_tokens(settings.tokens_file, settings.tokens)
    runs_open = check_open_bind(tokens, settings.host)
    api = ApiState(settings=settings, tokens=tokens, database_url=database_url, metrics=metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if runs_open:
            log.warning(
                "no API tokens configured: the API is open to anyone who can reach "
                f"{settings.host} (set RECEIPT_API_TOKENS_FILE or RECEIPT_API_TOKENS)",
                extra={"event": "api.open"},
            )
        api.stopping.clear()
        url = api.database_url
        if url is None:
            from roles.infra.db import resolve_url

            url = api.database_url = resolve_url()
        if store is None:
            from roles.infra.db import open_store

            api.store = await open_store(url, api=True)
        else:
            api.store = store
        listening: asyncio.Task[None] | None = None
        if listener is None:
            api.listener = Listener(url)
            listening = asyncio.create_task(api.listener.run(), name="api-listener")
        else:
            api.listener = listener
        log.info("api started", extra={"event": "api.started", "tokens": len(tokens)})
        try:
            yield
        finally:
            api.stopping.set()
            if listening is not None:
                listening.cancel()
                with suppress(asyncio.CancelledError):
                    await listening
            if store is None:
                await api.store.close()
            api.store = None

    app = FastAPI(
        title="Receipt API",
        version="0.1.0",
        description=(
            "Enqueue jobs for AI agents and follow their receipts. Errors share one shape: "
            '`{"error": {"code", "message", "field"?, "allowed"?}}`.'
        ),
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        dependencies=[Depends(_clean_params)],
        # FastAPI's own OpenTelemetry: the request span only while spans are recorded (the
        # enqueue's trace id does not need it), and none of its per-dependency spans, metrics
        # (Prometheus has ours) or log records — each a cost on every request.
        telemetry={
            "tracing": tracing_recording(),
            "operation_spans": False,
            "metrics": False,
            "logs": False,
        },
    )
    app.state.api = api
    _install_error_handlers(app)
    from roles.api.console.pages import install_console
    from roles.api.routes import retry as retry_routes

    app.include_router(retry_routes.router)
    install_docs(app)
    install_console(app)
    _install_routes(app)
    from roles.api.routes import agent_jobs, sessions

    app.include_router(agent_jobs.router)
    app.include_router(sessions.router)
    app.openapi = _openapi_builder(app)  # type: ignore[method-assign]
    return app


def _openapi_builder(app: FastAPI) -> Callable[[], dict[str, Any]]:
    def build() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        _, definitions = models_json_schema(
            [(EnqueueBody, "validation"), (CommandBody, "validation")],
            ref_template="#/components/schemas/{model}",
        )
        schema.setdefault("components", {}).setdefault("schemas", {}).update(definitions["$defs"])
        app.openapi_schema = schema
        return schema

    return build


def _install_routes(app: FastAPI) -> None:
    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        """Prometheus metrics of the api process (text exposition format)."""
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", response_model=Health, tags=["health"])
    async def healthz() -> dict[str, str]:
        """The process is up (it does not touch the database)."""
        return {"status": "ok"}

    @app.get("/readyz", response_model=Ready, responses=errors_documented(503), tags=["health"])
    async def readyz(state: State) -> JSONResponse:
        """The database is reachable and migrated to the version this code ships."""
        try:
            version = await asyncio.wait_for(
                _schema_ready(state.require_store()), timeout=READY_TIMEOUT_S
            )
        except (TimeoutError, StorageError) as exc:
            if isinstance(exc, TransientStorageError | TimeoutError):
                raise TransientStorageError(str(exc) or "database timeout") from exc
            # A non-transient error here is the missing migrations table: not migrated.
            raise ApiError(
                503,
                "not_migrated",
                "the database schema is not migrated; run `receipt migrate`",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            ) from exc
        return JSONResponse({"status": "ready", "schemaVersion": version})

    @app.post(
        "/agents/{agentId}/jobs",
        status_code=202,
        response_model=EnqueueAccepted,
        responses=errors_documented(400, 401, 403, 404, 409, 413, 422, 503),
        openapi_extra=json_body_documented("EnqueueBody"),
        dependencies=[_takes_query()],
        tags=["jobs"],
    )
    async def post_job(
        request: Request,
        state: State,
        caller: Caller,
        agent_id: Annotated[
            str,
            Path(
                alias="agentId",
                max_length=MAX_ID_LENGTH,
                pattern=NON_BLANK,
                description="The agent that runs the job",
            ),
        ],
    ) -> JSONResponse:
        """Enqueue a job (202). An idempotent re-post, or a `steer` absorbed into an active job,
        also answers 202 with that job; `outcome` says which."""
        body = _object(await read_json_body(request, state.settings.max_body_bytes), ENQUEUE_FIELDS)
        if state.settings.strict_agent_ids and agent_id not in AGENT_IDS:
            raise ApiError(
                404,
                "unknown_agent",
                f"no handler for agent {agent_id!r}; agent ids: {', '.join(AGENT_IDS)}",
                field="agentId",
                allowed=AGENT_IDS,
            )
        enqueue_request = parse_enqueue(agent_id, body)
        if not caller.admin and enqueue_request.organization_id != caller.organization_id:
            raise ApiError(
                403,
                "forbidden",
                "payload.authContext.organizationId is not the token's organization",
                field="payload.authContext.organizationId",
            )
        with _tracer.start_as_current_span(
            "receipt.enqueue", attributes={"receipt.agent_id": agent_id}
        ):
            enqueue_request = dataclasses.replace(
                enqueue_request,
                trace_id=trace_id_of(current_traceparent()),
                traceparent=current_traceparent(),
            )
            result = await enqueue(state.require_store(), enqueue_request)
        job = result.job
        if state.metrics is not None:
            state.metrics.job_enqueued(job, result.outcome)
        log.info(
            "job enqueued",
            extra={
                "event": "api.enqueued",
                "jobId": job.job_id,
                "agentId": job.agent_id,
                "outcome": result.outcome,
            },
        )
        content = {
            "job": job_view(job),
            "outcome": result.outcome,
            "async": {
                "jobId": job.job_id,
                "stream": jobmodel.job_stream(job.job_id),
                "jobUrl": _job_path(request, job.job_id),
                "eventsUrl": _job_path(request, job.job_id, "/events"),
                "status": job.status,
            },
        }
        return JSONResponse(content, status_code=202)

    @app.get(
        "/jobs",
        response_model=JobList,
        responses=errors_documented(401, 422, 503),
        dependencies=[_takes_query(*LIST_QUERY)],
        tags=["jobs"],
    )
    async def list_jobs(
        state: State,
        caller: Caller,
        status: Annotated[str | None, Query(json_schema_extra={"enum": list(STATUSES)})] = None,
        agent_id: Annotated[
            str | None, Query(alias="agentId", min_length=1, max_length=MAX_ID_LENGTH)
        ] = None,
        lane: Annotated[str | None, Query(json_schema_extra={"enum": list(LANES)})] = None,
        session_key: Annotated[
            str | None, Query(alias="sessionKey", min_length=1, max_length=MAX_ID_LENGTH)
        ] = None,
        kind: Annotated[str | None, Query(json_schema_extra={"enum": list(KINDS)})] = None,
        organization_id: Annotated[
            str | None, Query(alias="organizationId", min_length=1, max_length=MAX_ID_LENGTH)
        ] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        cursor: Annotated[str | None, Query(min_length=1, max_length=1000)] = None,
    ) -> JSONResponse:
        """List the caller's jobs, newest first, one page at a time (keyset cursor)."""
        before_created_at, before_job_id = decode_cursor(cursor) if cursor else (None, None)
        params = {
            "all_organizations": caller.admin,
            "caller_organization_id": caller.organization_id,
            "organization_id": organization_id,
            "status": _choice(status, "status", STATUSES),
            "agent_id": agent_id,
            "lane": _choice(lane, "lane", LANES),
            "session_key": session_key,
            "kind": _choice(kind, "kind", KINDS),
            "before_created_at": before_created_at,
            "before_job_id": before_job_id,
            "limit": limit + 1,
        }
        found = await _list_jobs(state.require_store(), params)
        page = found[:limit]
        next_cursor = encode_cursor(page[-1]) if len(found) > limit else None
        return JSONResponse({"jobs": [job_view(j) for j in page], "nextCursor": next_cursor})

    @app.get(
        "/jobs/{jobId:path}/events",
        response_model=EventsPage,
        responses={
            200: {
                "description": "The receipts as JSON, or with `Accept: text/event-stream` a live "
                "stream: one event per receipt (`id` = seq, `data` = the receipt), then "
                "`event: end` after the terminal receipt.",
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            },
            **errors_documented(401, 404, 422, 503),
        },
        openapi_extra={
            "parameters": [
                {
                    "name": "Last-Event-ID",
                    "in": "header",
                    "required": False,
                    "description": "Resume after this seq (sent by EventSource on reconnect); "
                    "wins over `after`",
                    "schema": {"type": "integer", "minimum": 0},
                }
            ]
        },
        dependencies=[_takes_query("after", "limit")],
        tags=["jobs"],
    )
    async def job_events(
        request: Request,
        state: State,
        caller: Caller,
        job_id: JobId,
        after: Annotated[int, Query(ge=0, description="Only receipts with seq > after")] = 0,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> Any:
        """A job's receipts in order; with `Accept: text/event-stream`, live until terminal."""
        job = await _visible_job(state, caller, job_id)
        last_event_id = request.headers.get("last-event-id")
        resume = after
        if last_event_id is not None:
            if not last_event_id.strip().isdigit() or not last_event_id.isascii():
                raise InvalidInput("Last-Event-ID", "Last-Event-ID must be a receipt seq (>= 0)")
            resume = int(last_event_id)
        store = state.require_store()
        if "text/event-stream" in request.headers.get("accept", ""):
            assert state.listener is not None
            events = receipt_events(
                store,
                state.listener,
                state.stopping,
                job_id,
                resume,
                keepalive_s=state.settings.sse_keepalive_ms / 1000,
            )
            return StreamingResponse(
                events,
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        receipts = await store.read_stream(jobmodel.job_stream(job_id), resume, limit)
        return JSONResponse(
            {
                "jobId": job.job_id,
                "stream": jobmodel.job_stream(job.job_id),
                "status": job.status,
                "receipts": [r.to_json() for r in receipts],
                "lastSeq": receipts[-1].seq if receipts else resume,
            }
        )

    @app.post(
        "/jobs/{jobId:path}/commands",
        status_code=202,
        response_model=CommandAccepted,
        responses=errors_documented(400, 401, 404, 409, 413, 422, 503),
        openapi_extra=json_body_documented("CommandBody"),
        dependencies=[_takes_query()],
        tags=["jobs"],
    )
    async def post_command(
        request: Request, state: State, caller: Caller, job_id: JobId
    ) -> JSONResponse:
        """Append a steer, follow_up or abort command; 409 when the job is already terminal."""
        body = _object(await read_json_body(request, state.settings.max_body_bytes), COMMAND_FIELDS)
        command_type = body.get("type")
        if not isinstance(command_type, str) or command_type not in COMMAND_TYPES:
            raise InvalidInput(
                "type", f"type must be one of: {', '.join(COMMAND_TYPES)}", COMMAND_TYPES
            )
        reason = body.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise InvalidInput("reason", "reason must be a string")
        command_id = f"cmd-{uuid.uuid4()}"
        for _ in range(COMMAND_CONFLICT_RETRIES):
            outcome = await operations.add_command(
                state.require_store(),
                job_id,
                type=command_type,
                payload=body.get("payload"),
                reason=reason,
                organization_id=caller.organization_id,
                check_organization=not caller.admin,
                command_id=command_id,
            )
            if outcome.status != operations.SETTLEMENT_CONFLICT:
                break
        if outcome.status == operations.NOT_FOUND:
            raise ApiError(404, "not_found", f"no job {job_id!r}", field="jobId")
        if outcome.status == operations.TERMINAL_STATE:
            status = outcome.job.status if outcome.job else "terminal"
            raise ApiError(
                409, "terminal_state", f"job {job_id!r} is {status}; it takes no more commands"
            )
        if not outcome.ok or outcome.job is None:
            raise TransientStorageError(f"command not appended: {outcome.status}")
        log.info(
            "command appended",
            extra={"event": "api.command", "jobId": job_id, "type": command_type},
        )
        return JSONResponse(
            {
                "commandId": command_id,
                "jobId": job_id,
                "type": command_type,
                "job": job_view(outcome.job),
            },
            status_code=202,
        )

    @app.get(
        "/jobs/{jobId:path}",
        response_model=JobView,
        responses=errors_documented(401, 404, 422, 503),
        dependencies=[_takes_query()],
        tags=["jobs"],
    )
    async def get_job(state: State, caller: Caller, job_id: JobId) -> JSONResponse:
        """The folded job with its route, contract worker group, attempt, lease and commands."""
        return JSONResponse(job_view(await _visible_job(state, caller, job_id)))


# --- serving --------------------------------------------------------------------------------


class _Server(uvicorn.Server):
    """uvicorn's server, stopped by the role's own stop event rather than its signal handlers.

    Open event streams are told to end as soon as shutdown begins, so they do not hold it up.
    """

    def __init__(self, config: uvicorn.Config, streams_stopping: asyncio.Event) -> None:
        super().__init__(config)
        self._streams_stopping = streams_stopping

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The role process owns SIGINT/SIGTERM (see `run_api` and roles.role).
        yield

    async def shutdown(self, sockets: Any = None) -> None:
        self._streams_stopping.set()
        await super().shutdown(sockets=sockets)


async def serve_api(
    stop: asyncio.Event,
    settings: ApiSettings | None = None,
    *,
    store: Store | None = None,
    listener: Listener | None = None,
    metrics: EnqueueObserver | None = None,
) -> None:
    """Serve the API until `stop` is set.

    Without a `store` it resolves the database and migrates first. A role process that already
    holds a store (migrated) and a running listener passes them, so the process keeps one pool
    and one LISTEN connection. Raises `TokenConfigError` (before touching the database) when the
    tokens are invalid, or missing on a non-loopback bind, and `RuntimeError` when the server
    did not start.
    """
    from roles.infra.db import migrate_url, resolve_url

    settings = settings or ApiSettings()
    check_open_bind(load_tokens(settings.tokens_file, settings.tokens), settings.host)
    url = resolve_url()
    if store is None:
        await migrate_url(url)
    app = create_app(settings, database_url=url, store=store, listener=listener, metrics=metrics)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        lifespan="on",
        log_config=None,
        timeout_graceful_shutdown=10,
        server_header=False,
    )
    server = _Server(config, app.state.api.stopping)

    async def stop_when_asked() -> None:
        await stop.wait()
        server.should_exit = True

    watcher = asyncio.create_task(stop_when_asked())
    try:
        await server.serve()
    finally:
        watcher.cancel()
    if not server.started:
        raise RuntimeError("the api did not start (see the log above)")


def run_api(settings: ApiSettings | None = None) -> None:
    """Serve the API in this process until SIGINT or SIGTERM (the `receipt api` command)."""
    from roles.infra import logs

    logs.configure("api")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve_api(stop, settings)

    asyncio.run(main())
