"""The API's one error shape, `{"error": {"code", "message", "field"?, "allowed"?}}`, and the
handlers that turn every failure (ours, pydantic's, Starlette's, the store's) into it."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from receipts.errors import (
    ConflictError,
    InvalidInput,
    NotPermitted,
    TransientStorageError,
    UnansweredStorageError,
)

log = logging.getLogger("roles.api.app")

RETRY_AFTER_S = 5


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


def too_many(message: str, retry_after_s: float) -> ApiError:
    """A 429 with `Retry-After` (whole seconds, at least 1)."""
    seconds = max(1, int(retry_after_s + 0.999))
    return ApiError(429, "too_many_requests", message, headers={"Retry-After": str(seconds)})


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
    429: "too_many_requests",
    503: "storage_unavailable",
}


def _field_of(location: Sequence[Any]) -> str:
    parts = [str(p) for p in location]
    if parts and parts[0] in ("query", "path", "header", "body"):
        parts = parts[1:]
    return ".".join(parts) or "request"


KNOWN_FAILURES: tuple[type[Exception], ...] = (
    ApiError,
    InvalidInput,
    ConflictError,
    TransientStorageError,
)
"""What a route raises on purpose; `known_answer` turns each into its answer."""


def known_answer(exc: Exception, request: Request) -> JSONResponse:
    """The answer to one of the `KNOWN_FAILURES` raised while answering `request`: the error
    as it is, a bad input 422, a taken id 409, a database outage 503 with `Retry-After` (logged).
    A request that writes whose connection to the database was lost before the database's
    answer (`UnansweredStorageError`) is told its write may have been applied: a commit whose
    answer was lost made it, and sent again without its Idempotency-Key it is made twice. One
    that carried none is told so, not to send it again with 'the same' key.

    The app's exception handlers and the enqueue gate's answer (roles/api/gate.py) both use it.
    """
    if isinstance(exc, ApiError):
        return error_response(exc)
    if isinstance(exc, NotPermitted):
        return error_response(
            ApiError(403, "forbidden", exc.message, field=exc.field, allowed=exc.allowed)
        )
    if isinstance(exc, InvalidInput):
        return error_response(
            ApiError(422, "invalid_input", exc.message, field=exc.field, allowed=exc.allowed)
        )
    if isinstance(exc, ConflictError):
        return error_response(ApiError(409, "conflict", "jobId already in use"))
    assert isinstance(exc, TransientStorageError), exc
    log.warning(
        "database unavailable",
        extra={"event": "api.storage_unavailable", "path": request.url.path, "error": str(exc)},
    )
    message = "the database is unavailable; retry later"
    if isinstance(exc, UnansweredStorageError) and request.method not in ("GET", "HEAD"):
        again = (
            "send it again with the same Idempotency-Key, which finds what it made"
            if "idempotency-key" in request.headers
            else "it carried no Idempotency-Key: sent again, it may be applied twice unless it "
            "names its own id (an enqueue's jobId)"
        )
        message = (
            "the database connection was lost before its answer: the request may have been "
            f"applied; {again}"
        )
    return error_response(
        ApiError(
            503,
            "storage_unavailable",
            message,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    )


def install_error_handlers(app: FastAPI) -> None:
    """Answer every failure with the one error shape; a bug answers 500 and is logged."""

    async def known(request: Request, exc: Exception) -> JSONResponse:
        return known_answer(exc, request)

    for failure in KNOWN_FAILURES:
        app.add_exception_handler(failure, known)

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
        headers = exc.headers
        if exc.status_code == 405:
            # Starlette's `Allow` names the methods of the first route whose path matched; a
            # path several routes serve (GET and DELETE /webhooks/{id}) allows all of theirs.
            given = (headers or {}).get("Allow", "")
            headers = {**(headers or {}), "Allow": ", ".join(_allowed(request, given))}
        return error_response(ApiError(exc.status_code, code, message, headers=headers))

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:
        # A bug, not an outage: logged with its traceback, answered 500, re-raised by Starlette.
        log.error(
            "unhandled error",
            exc_info=exc,
            extra={"event": "api.unhandled", "path": request.url.path},
        )
        return error_response(ApiError(500, "internal", "internal error"))


_METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})


@cache
def _template(path: str) -> re.Pattern[str]:
    """A documented path (`/webhooks/{webhookId}`) as a pattern of the paths it serves."""
    parts = re.split(r"(\{[^}]+\})", path)
    return re.compile("".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts))


def _allowed(request: Request, given: str) -> list[str]:
    """Every method of every documented route serving the request's path, with those Starlette
    named (`given`)."""
    methods = {m.strip() for m in given.split(",") if m.strip()}
    paths = request.app.openapi().get("paths", {})
    matching = [path for path in paths if _template(path).fullmatch(request.url.path)]
    # A path documented as it is (`/jobs/retry`) is that route's alone, not `/jobs/{jobId}`'s.
    exact = [path for path in matching if "{" not in path]
    for path in exact or matching:
        methods |= {m.upper() for m in paths[path] if m in _METHODS}
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)
