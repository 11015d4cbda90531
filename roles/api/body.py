"""Reading request bodies and list cursors: bounded work per request.

A body is refused before anything looks at it when it is too large (413), not JSON (400), or
not the shape any request can have (422): nested deeper than `max_json_depth`, more than
`max_json_nodes` values, a key longer than `max_json_key_chars`, NUL or a lone surrogate in any
string. One iterative pass checks all of it; a field path is built only for the error. The pass
gives the event loop a turn every `WALK_CHUNK` values, so `/healthz` and every other request
keep being served while a large body is checked.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, TypeVar
from urllib.parse import quote

from fastapi import Header, Request
from pydantic import BaseModel, ValidationError

from receipts import metrics
from receipts.enqueue_request import JOB_ID_PATTERN
from receipts.errors import InvalidInput
from receipts.kinds import invalid_input
from receipts.reads import Position
from receipts.text import _BAD, check_clean_text
from roles.api.errors import ApiError
from roles.api.limits import ADMIN_BUCKET, CALLER, BodyBytes

M = TypeVar("M", bound=BaseModel)

MAX_JSON_DEPTH = 64
WALK_CHUNK = 2000
"""Values checked between two turns of the event loop (about a millisecond of work)."""


@dataclass(frozen=True, slots=True)
class JsonLimits:
    """How much one JSON body may hold (`RECEIPT_MAX_JSON_*`)."""

    depth: int = MAX_JSON_DEPTH
    nodes: int = 50_000
    key_chars: int = 256


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


def _walk(value: Any, limits: JsonLimits) -> Iterator[None]:
    """Check `value` against `limits`, yielding every `WALK_CHUNK` values (see `check_shape`)."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    nodes = 0
    search = _BAD.search
    bad_text = False
    while pending:
        item, depth = pending.pop()
        nodes += 1
        if nodes % WALK_CHUNK == 0:
            yield
        if nodes > limits.nodes:
            raise InvalidInput("body", f"the JSON body holds more than {limits.nodes} values")
        if isinstance(item, str):
            if search(item):
                bad_text = True
        elif isinstance(item, dict):
            if depth > limits.depth:
                raise InvalidInput("body", f"the JSON body nests deeper than {limits.depth} levels")
            for key, child in item.items():
                if len(key) > limits.key_chars:
                    raise InvalidInput(
                        "body", f"a JSON key is longer than {limits.key_chars} characters"
                    )
                if search(key):
                    bad_text = True
                pending.append((child, depth + 1))
        elif isinstance(item, list):
            if depth > limits.depth:
                raise InvalidInput("body", f"the JSON body nests deeper than {limits.depth} levels")
            if nodes + len(item) > limits.nodes:
                raise InvalidInput("body", f"the JSON body holds more than {limits.nodes} values")
            pending.extend((child, depth + 1) for child in item)
    if bad_text:
        check_clean_text(value, "")


def check_shape(value: Any, limits: JsonLimits) -> None:
    """Raise `InvalidInput` when `value` breaks a limit or holds text `jsonb` cannot store.

    One pass, no path strings: the walk keeps (item, depth) pairs only; on a text error the
    document is walked again by `check_clean_text` to name the field.
    """
    for _ in _walk(value, limits):
        pass


async def check_shape_yielding(value: Any, limits: JsonLimits) -> None:
    """`check_shape`, giving the event loop a turn every `WALK_CHUNK` values.

    A thread would not help: the walk holds the GIL, and the loop then waits for it at every
    turn (measured: `/healthz` p90 466 ms beside a thread walking 1 MiB bodies, on a loaded
    machine); yielding keeps each slice of the walk to about a millisecond.
    """
    try:
        for _ in _walk(value, limits):
            await asyncio.sleep(0)
    except InvalidInput:
        metrics.API_LIMITED.labels("body_shape").inc()
        raise


def loads(text: str) -> Any:
    """`text` as JSON as the API reads it: NaN, infinities and a number past a float's range
    are not JSON (ValueError), since `jsonb` stores none of them."""
    return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)


def decode_json(raw: bytes) -> Any:
    """Decode a body (400 when it is not UTF-8 JSON, NaN and infinities included).

    `json.loads` runs in C, bounded by `RECEIPT_MAX_BODY_BYTES` (about 10 ms per MiB).
    """
    if not raw.strip():
        raise ApiError(400, "malformed_json", "the request body must be a JSON document")
    try:
        return loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ApiError(400, "malformed_json", "the request body is not UTF-8") from exc
    except RecursionError as exc:
        raise ApiError(400, "malformed_json", "the JSON body nests too deeply") from exc
    except ValueError as exc:
        raise ApiError(400, "malformed_json", f"malformed JSON: {exc}") from exc


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413, "body_too_large", f"the request body exceeds {limit} bytes (RECEIPT_MAX_BODY_BYTES)"
    )


def declared_length(declared: str | None) -> int | None:
    """A `Content-Length` header's value as bytes; None when absent; -1 when not a number."""
    if declared is None:
        return None
    return int(declared) if declared.isdigit() and len(declared) <= 20 else -1


def check_declared_length(request: Request, limit: int) -> None:
    """Refuse a body whose `Content-Length` exceeds `limit` (413) or is not a number (400),
    before anything else is spent on the request (an enqueue checks it before its rate)."""
    length = declared_length(request.headers.get("content-length"))
    if length == -1:
        raise ApiError(400, "malformed_json", "Content-Length is not a number")
    if length is not None and length > limit:
        raise _too_large(limit)


async def read_raw_body(request: Request, limit: int) -> bytes:
    """Read the body, refusing it (413) as soon as `Content-Length` or the bytes exceed `limit`,
    and (429) once the caller's organization's bodies being read pass
    `RECEIPT_ORG_BODY_BYTES_IN_FLIGHT` (roles/api/limits.py `BodyBytes`)."""
    check_declared_length(request, limit)
    too_large = _too_large(limit)
    caller = getattr(request.state, CALLER, None)
    bodies: BodyBytes | None = getattr(getattr(request.app.state, "api", None), "bodies", None)
    key = (caller.organization_id or ADMIN_BUCKET) if caller is not None else ""
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            if size + len(chunk) > limit:
                raise too_large
            if bodies is not None and caller is not None:
                bodies.take(key, len(chunk))
            size += len(chunk)
            chunks.append(chunk)
    finally:
        if bodies is not None and caller is not None:
            bodies.give(key, size)
    return b"".join(chunks)


async def read_json_body(request: Request, limit: int, limits: JsonLimits | None = None) -> Any:
    """Read, decode and check the JSON body (413, 400, 422: see the module docstring).

    Text is checked here, once per request: callers pass `text_checked=True` on.
    """
    return await _checked_json(await read_raw_body(request, limit), limits)


async def _checked_json(raw: bytes, limits: JsonLimits | None) -> Any:
    body = decode_json(raw)
    await check_shape_yielding(body, limits or JsonLimits())
    return body


async def read_optional_json_body(
    request: Request, limit: int, limits: JsonLimits | None = None
) -> Any:
    """`read_json_body` for a route whose body may be left out: None for an empty (or blank)
    one. Read under the same limit: a body of blanks is still bytes to read."""
    raw = await read_raw_body(request, limit)
    return await _checked_json(raw, limits) if raw.strip() else None


def json_object(body: Any, allowed: tuple[str, ...]) -> dict[str, Any]:
    """The body as an object with no field outside `allowed` (422 naming the first unknown)."""
    if not isinstance(body, dict):
        raise InvalidInput("body", "the request body must be a JSON object")
    unknown = [name for name in body if name not in allowed]
    if unknown:
        raise InvalidInput(unknown[0], f"unknown field {unknown[0]!r}", allowed)
    return body


def validated(model: type[M], body: Any) -> M:
    """Validate `body` with `model` (the same model documents it); 422 naming the field."""
    if not isinstance(body, dict):
        raise InvalidInput("body", "the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        error = invalid_input(exc)
        if error.message.startswith("unknown field") and "." not in error.field:
            error.allowed = [f.alias or n for n, f in model.model_fields.items()]
        raise error from None


def choice(value: str | None, name: str, allowed: tuple[str, ...]) -> str | None:
    """`value` when it is None or one of `allowed`; else 422 naming them."""
    if value is not None and value not in allowed:
        raise InvalidInput(name, f"{name} must be one of: {', '.join(allowed)}", allowed)
    return value


def path_segment(value: str) -> str:
    """An id as one URL path segment: every reserved character escaped, and an id `.` or `..`
    (a job id, a session id may be one) as `%2E` / `%2E%2E`: left as it is, a client (httpx,
    curl, a browser) resolves it as a dot segment, so `/jobs/..` is `/` and `/jobs/./events`
    is `/jobs/events`. The API reads `%2E%2E` as `..` (the client does the same:
    clients/python/receipt_client/_calls.py `segment`)."""
    quoted = quote(value, safe="")
    return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted


def job_path(request: Request, job_id: str, suffix: str = "") -> str:
    """The URL path of a job (as the caller names it)."""
    root = request.scope.get("root_path", "")
    return f"{root}/jobs/{path_segment(job_id)}{suffix}"


def encode_cursor(created_at: datetime, key: str) -> str:
    """Return the opaque cursor that continues a list (newest first) after the item created at
    `created_at` with id `key` (a job, an objective, an agent job)."""
    raw = json.dumps([created_at.isoformat(), key], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> Position | None:
    """Where the page `cursor` asks for starts (None: the first page); raise `InvalidInput`
    for a cursor this API did not return."""
    if cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, key = json.loads(raw)
        at = datetime.fromisoformat(created_at)
        if not isinstance(key, str) or at.tzinfo is None:
            raise ValueError(cursor)
        check_clean_text(key, "cursor")
    except (InvalidInput, ValueError, TypeError, binascii.Error, OverflowError) as exc:
        raise InvalidInput("cursor", "cursor is not one this API returned") from exc
    return Position(at, key)


IDEMPOTENCY_NAMESPACE = uuid.UUID("6f1f6c4e-4f0e-4f51-9a39-2a4d1d6c2b10")
"""`Idempotency-Key: K` on a post that names no id names what it makes uuid5(this, K): a retry
of the post finds it (a job, an objective, a schedule, a command)."""

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        pattern=JOB_ID_PATTERN,
        description="Makes a post that names no id retryable: the same key names what it made",
    ),
]


def keyed_id(key: str | None) -> str | None:
    """The id an `Idempotency-Key` names (None without one)."""
    return None if key is None else str(uuid.uuid5(IDEMPOTENCY_NAMESPACE, key))
