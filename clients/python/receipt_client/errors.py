"""The API's refusals as exceptions: one class per status, each carrying the API's error."""

from __future__ import annotations

from typing import Any

import httpx


class ReceiptError(Exception):
    """The API refused a request (or could not be reached: `status` None).

    `code`, `field` and `allowed` are the API's error body (`{"error": {...}}`); `retry_after`
    is its `Retry-After` in seconds, when it sent one (429, 503)."""

    status: int | None = None

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        field: str | None = None,
        allowed: list[str] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status if status is not None else type(self).status
        self.code = code
        self.field = field
        self.allowed = allowed
        self.retry_after = retry_after

    def __str__(self) -> str:
        status = " ".join(str(part) for part in (self.status, self.code) if part)
        named = ", ".join(
            part for part in (status, f"field {self.field}" * bool(self.field)) if part
        )
        text = f"{self.message} ({named})" if named else self.message
        if self.allowed and not all(value in self.message for value in self.allowed):
            text += f"; allowed: {', '.join(self.allowed)}"
        if self.retry_after:  # a 429's or a 503's: when to send it again
            text += f"; retry after {self.retry_after:g} s"
        return text


class BadRequest(ReceiptError):
    """400: the body is not JSON, or not the JSON the API reads."""

    status = 400


class Unauthorized(ReceiptError):
    """401: no token, or one the API does not know."""

    status = 401


class Forbidden(ReceiptError):
    """403: the token lacks the scope, or acts for another organization."""

    status = 403


class NotFound(ReceiptError):
    """404: no such job, objective, agent job or session (for this organization)."""

    status = 404


class Conflict(ReceiptError):
    """409: the thing is in a state that refuses the request (terminal, an id reused)."""

    status = 409


class PayloadTooLarge(ReceiptError):
    """413: the body is larger than the API takes."""

    status = 413


class UnsupportedMediaType(ReceiptError):
    """415: the body is not `application/json`."""

    status = 415


class InvalidInput(ReceiptError):
    """422: a field is invalid; `field` names it and `allowed` lists the choices."""

    status = 422


class RateLimited(ReceiptError):
    """429: a limit was reached (rate, queued or running jobs, open streams); see `retry_after`."""

    status = 429


class Unavailable(ReceiptError):
    """503: the API cannot reach its database right now; see `retry_after`. Also a proxy's 502
    or 504 in front of the API (a restart, a rolling update: no api answered it), which the
    waits and streams ride out as they ride out a 503."""

    status = 503


class ServerError(ReceiptError):
    """Any other 5xx."""


class ObjectiveNotCreated(ReceiptError):
    """The `factory.run` job of an objective failed (`code`: its status), so the objective will
    never exist: an invalid planned graph, say."""


class ConnectionFailed(ReceiptError):
    """The API could not be reached, or a stream was lost past the reconnect attempts."""


BY_STATUS: dict[int, type[ReceiptError]] = {
    cls.status: cls
    for cls in (
        BadRequest,
        Unauthorized,
        Forbidden,
        NotFound,
        Conflict,
        PayloadTooLarge,
        UnsupportedMediaType,
        InvalidInput,
        RateLimited,
        Unavailable,
    )
    if cls.status is not None
}
BY_STATUS |= {502: Unavailable, 504: Unavailable}  # a proxy's: the API away (its restart)


def error_of(response: httpx.Response) -> ReceiptError:
    """The exception of an error answer (its body read)."""
    status = response.status_code
    cls = BY_STATUS.get(status, ServerError if status >= 500 else ReceiptError)
    retry_after = _seconds(response.headers.get("Retry-After"))
    try:
        error: dict[str, Any] = response.json()["error"]
        return cls(
            str(error["message"]),
            status=status,
            code=error.get("code"),
            field=error.get("field"),
            allowed=error.get("allowed"),
            retry_after=retry_after,
        )
    except (ValueError, KeyError, TypeError):
        return cls(f"HTTP {status}: {response.text[:200]}", status=status, retry_after=retry_after)


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class WaitTimedOut(ReceiptError, TimeoutError):
    """A wait (`wait`, `wait_objective`) gave up at its `timeout`: what it waited for has not
    ended, and goes on (wait again to go on waiting)."""
