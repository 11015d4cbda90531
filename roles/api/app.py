"""The api role: the HTTP API over the receipt store (FastAPI), served by uvicorn.

The package: `settings` (ApiSettings), `errors` (the one error shape), `body` (bounded body
reading, cursors), `auth` (tokens, scopes), `deps` (shared state and the dependency aliases
routes use), `sse` (event streams and their caps), `limits` (per-organization rates),
`schema` (request and response models), and `routes/` (one `APIRouter` per resource). This
module builds the app (lifespan, routers, OpenAPI) and serves it; it re-exports the names code
written against the one-module API imported from here.

Every error answers one JSON shape, `{"error": {"code", "message", "field"?, "allowed"?}}`, and
writes nothing. A database outage answers 503 with `Retry-After`; anything else that escapes a
route is a bug and answers 500 (logged).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import Any

import uvicorn
from fastapi import APIRouter, Depends, FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from receipts.enqueue_batch import EnqueueBatcher
from receipts.listen import Listener
from receipts.store import Store
from roles.api.auth import check_open_bind, load_tokens
from roles.api.console import install_console
from roles.api.deps import ApiState, clean_params
from roles.api.docs import install_docs
from roles.api.documented import DOCUMENTED
from roles.api.errors import install_error_handlers
from roles.api.gate import EnqueueGate
from roles.api.http_protocol import http_protocol
from roles.api.in_flight import InFlightGate
from roles.api.request_metrics import RequestMetrics
from roles.api.routes import (
    agent_jobs,
    agent_jobs_console,
    commands,
    health,
    jobs,
    objectives,
    retry,
    schedules,
    sessions,
)
from roles.api.routes.retry import BulkRetryBody
from roles.api.routes.webhooks import WebhookCreateBody
from roles.api.routes.webhooks import router as webhooks_router
from roles.api.schema import CommandBody, EnqueueBody
from roles.api.settings import GRACEFUL_SHUTDOWN_S
from roles.infra.db import migrate_url, open_store, resolve_url
from roles.infra.settings import RuntimeSettings
from roles.infra.tracing import recording as tracing_recording

log = logging.getLogger("roles.api.app")


def routers() -> list[APIRouter]:
    """The resources' routers, in the order their routes are matched.

    A new resource adds its module's `router` to this list.
    """
    return [
        health.router,
        retry.router,
        webhooks_router,
        commands.router,  # before jobs': its GET /jobs/{jobId:path} matches any path
        jobs.router,
        agent_jobs.router,
        agent_jobs_console.router,
        sessions.router,
        objectives.router,
        schedules.router,
    ]


DOCUMENTED_BODIES: tuple[type[BaseModel], ...] = (
    EnqueueBody,
    CommandBody,
    BulkRetryBody,
    WebhookCreateBody,
    *DOCUMENTED,
)


def create_app(
    settings: RuntimeSettings | None = None,
    *,
    database_url: str | None = None,
    store: Store | None = None,
    listener: Listener | None = None,
) -> FastAPI:
    """Build the API with the process's `settings` (all defaults when None).

    The lifespan opens a `Store` on `database_url` and runs a `Listener` for event streams,
    unless the caller passes its own `store` / running `listener` (it then owns them). Raises
    `TokenConfigError` when the tokens cannot be read, or when none are configured and the bind
    is not loopback.
    """
    settings = settings or RuntimeSettings()
    tokens = load_tokens(settings.api.tokens_file, settings.api.tokens)
    runs_open = check_open_bind(tokens, settings.api.host)
    api = ApiState(
        settings=settings.api,
        tokens=tokens,
        database_url=database_url,
        core=settings.core,
        agent_jobs=settings.agent_jobs,
        webhooks=settings.webhooks,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if runs_open:
            log.warning(
                "no API tokens configured: the API is open to anyone who can reach "
                f"{settings.api.host} (set RECEIPT_API_TOKENS_FILE or RECEIPT_API_TOKENS); it "
                "answers loopback Host names and JSON bodies only",
                extra={"event": "api.open"},
            )
        api.stopping.clear()
        url = api.database_url
        if url is None:
            url = api.database_url = resolve_url(settings.core)
        pooled = settings.core.database_direct_url is not None  # `url` a transaction pooler
        if store is None:
            api.store = await open_store(url, settings.core, api=True, pooled=pooled)
        else:
            api.store = store
        api.enqueuer = EnqueueBatcher(api.store)
        listening: asyncio.Task[None] | None = None
        if listener is None:
            api.listener = Listener(settings.core.database_direct_url or url)
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
            api.enqueuer = None

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
        dependencies=[Depends(clean_params)],
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
    install_error_handlers(app)
    # Inside the enqueue gate: an enqueue the gate answers is not counted in flight.
    app.add_middleware(InFlightGate)
    # Around the router: it sees every answer, 404s and refusals included.
    # Inside the metrics (the last added is the outermost): its refusals are counted too.
    app.add_middleware(EnqueueGate, serve=jobs.enqueue_front)
    app.add_middleware(RequestMetrics)
    for router in routers():
        app.include_router(router)
    install_docs(app)
    install_console(app)
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
            [(model, "validation") for model in DOCUMENTED_BODIES],
            ref_template="#/components/schemas/{model}",
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(definitions["$defs"])
        components.update(agent_jobs.NAMED_BODIES)
        _document_in_flight_refusal(schema)
        app.openapi_schema = schema
        return schema

    return build


def _document_in_flight_refusal(schema: dict[str, Any]) -> None:
    """Every route a token or a console session reaches may answer 429 past its organization's
    requests in flight (roles/api/in_flight.py): documented as the enqueue's 429 is."""
    operations = [op for path in schema["paths"].values() for op in path.values()]
    refusal = next(op["responses"]["429"] for op in operations if "429" in op["responses"])
    for operation in operations:
        answers = operation["responses"]
        if "401" in answers and "429" not in answers:
            answers["429"] = refusal


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
        # The role process owns SIGINT/SIGTERM (roles/role.py).
        yield

    async def shutdown(self, sockets: Any = None) -> None:
        self._streams_stopping.set()
        await super().shutdown(sockets=sockets)


async def serve_api(
    stop: asyncio.Event,
    settings: RuntimeSettings,
    *,
    store: Store | None = None,
    listener: Listener | None = None,
) -> None:
    """Serve the API until `stop` is set.

    Without a `store` it resolves the database and migrates first. A role process that already
    holds a store (migrated) and a running listener passes them, so the process keeps one pool
    and one LISTEN connection. Raises `TokenConfigError` (before touching the database) when the
    tokens are invalid, or missing on a non-loopback bind, and `RuntimeError` when the server
    did not start.
    """
    check_open_bind(load_tokens(settings.api.tokens_file, settings.api.tokens), settings.api.host)
    url = resolve_url(settings.core)
    if store is None:
        await migrate_url(settings.core.database_direct_url or url)
    app = create_app(settings, database_url=url, store=store, listener=listener)
    config = uvicorn.Config(
        app,
        host=settings.api.host,
        port=settings.api.port,
        lifespan="on",
        log_config=None,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        server_header=False,
        # httptools with bounds on a request's head: its size and how long it may take
        http=http_protocol(settings.api.head_timeout_ms / 1000),
    )
    server = _Server(config, app.state.api.stopping)

    async def stop_when_asked() -> None:
        await stop.wait()
        # Unready first, still serving: new connections keep arriving until the Service's
        # endpoints drop this pod. Then the port closes and open streams end.
        app.state.api.draining.set()
        delay_s = settings.api.drain_delay_ms / 1000
        log.info(
            "draining: /readyz answers 503; serving %g s more before closing the port",
            delay_s,
            extra={"event": "api.draining", "delayS": delay_s},
        )
        await asyncio.sleep(delay_s)
        server.should_exit = True

    watcher = asyncio.create_task(stop_when_asked())
    try:
        await server.serve()
    finally:
        watcher.cancel()
    if not server.started:
        raise RuntimeError("the api did not start (see the log above)")
