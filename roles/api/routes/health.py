"""Health, readiness and the api process's metrics (admin only: tenants choose label values)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from receipts import metrics, reads
from receipts.errors import StorageError, TransientStorageError
from receipts.schema import unapplied
from receipts.store import Store
from receipts.waits import within
from roles.api.auth import ADMIN
from roles.api.deps import ApiError, Caller, State, require_scope
from roles.api.errors import RETRY_AFTER_S
from roles.api.schema import Health, Ready, errors_documented

READY_TIMEOUT_S = 3.0

router = APIRouter()


async def schema_ready(store: Store) -> int:
    """Return the schema version when every shipped migration is applied; raise ApiError if not."""
    applied = await reads.applied_migrations(store)
    missing = unapplied(applied)
    if missing:
        raise ApiError(
            503,
            "not_migrated",
            f"migrations not applied: {missing}; run `receipt migrate`",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    return max(applied)


@router.get("/metrics", include_in_schema=False)
async def exposition(caller: Caller) -> Response:
    """Prometheus metrics of the api process (text exposition format); an admin token only."""
    require_scope(caller, ADMIN)
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz", response_model=Health, tags=["health"])
async def healthz() -> dict[str, str]:
    """The process is up (it does not touch the database)."""
    return {"status": "ok"}


@router.get("/readyz", response_model=Ready, responses=errors_documented(503), tags=["health"])
async def readyz(state: State) -> JSONResponse:
    """The database is reachable and migrated to the version this code ships (also the api's
    `receipt_role_ready`)."""
    metrics.ROLE_READY.set(0)
    if state.draining.is_set():
        raise ApiError(
            503,
            "draining",
            "the api is shutting down: it closes its port after RECEIPT_API_DRAIN_DELAY_MS",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    try:
        version = await within(schema_ready(state.require_store()), READY_TIMEOUT_S)
    except ApiError:
        raise
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
    metrics.ROLE_READY.set(1)
    return JSONResponse({"status": "ready", "schemaVersion": version})
