"""`BaseClient`: the transport under `Client` — the connection, the raw requests, JSON pages and
the live event stream every method of the API is built on.

`_aio_base.py` (`AsyncBaseClient`) is generated from this file by `make client`
(tools/client_models.py): change the two transports here."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any, Self

import httpx

from receipt_client._calls import NO_BODY, Call, M, request_options
from receipt_client.deadline import NEVER, Deadline
from receipt_client.errors import (
    ConnectionFailed,
    RateLimited,
    ReceiptError,
    ServerError,
    Unavailable,
    error_of,
)
from receipt_client.settings import PAGE, connection, shown, stream_timeout
from receipt_client.sse import RECONNECT_ATTEMPTS, parse_sse, reconnect_delay


class BaseClient:
    """A client's connection to the API: `url` defaults to `RECEIPT_API_URL` (else
    http://127.0.0.1:8000), `token` to `RECEIPT_API_TOKEN`."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url, headers = connection(url, token)
        self.shown_url = shown(self.url)  # what messages print: no password
        self.http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    # --- the raw requests every method is built on ----------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = NO_BODY,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Send one request; return its decoded JSON, or raise the API's refusal. `timeout`
        (seconds) bounds each of its phases instead of the client's own timeout."""
        options = request_options(method, json, headers)
        if timeout is not None:
            options["timeout"] = timeout
        try:
            response = self.http.request(method, path, params=params, **options)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # nothing was sent
            raise ConnectionFailed(f"cannot reach the API at {self.shown_url}: {exc}") from exc
        except httpx.TransportError as exc:
            if method == "GET":
                raise ConnectionFailed(
                    f"no answer from the API at {self.shown_url}: {exc}"
                ) from exc
            # Sent, perhaps applied (a timeout, a connection reset before the answer): only a
            # request that names its job (its id, or an Idempotency-Key) can be sent again
            # without doing it twice.
            key = {k.lower(): v for k, v in (headers or {}).items()}.get("idempotency-key")
            again = (
                f"send it again with Idempotency-Key {key} to find out"
                if key is not None
                else "it carried no Idempotency-Key: sent again, it may be applied twice "
                "unless it names its id (enqueue's job_id)"
            )
            raise ConnectionFailed(
                f"no answer from the API at {self.shown_url} to {method} {path} "
                f"({exc or type(exc).__name__}): it may have been applied; {again}"
            ) from exc
        if response.status_code >= 400:
            raise error_of(response)
        if response.status_code == 204:
            return None  # a deletion answers no body
        try:
            return response.json()
        except ValueError as exc:  # not the API (a proxy's page, another service at the URL)
            raise ServerError(
                f"{self.shown_url} answered {method} {path} with a body that is not JSON "
                f"({response.headers.get('content-type') or 'no content type'})",
                status=response.status_code,
            ) from exc

    def _send(self, call: Call[M], timeout: float | None = None) -> M:
        answer = self.request(
            call.method,
            call.path,
            params=call.params,
            json=call.body,
            headers=call.headers,
            timeout=timeout,
        )
        return call.model.model_validate(answer)

    def _read_through_outages(self, call: Call[M], deadline: Deadline = NEVER) -> M:
        """`call` (a read), retried across the api being away (a restart, a 503) as a stream is,
        until `deadline` (then `WaitTimedOut`)."""
        failures = 0
        while True:
            try:
                return self._send(call, deadline.request_timeout())
            except (ConnectionFailed, Unavailable) as exc:
                deadline.allows(0, exc)  # a read the deadline cut short
                failures += 1
                if failures > RECONNECT_ATTEMPTS:
                    raise
                wait = max(reconnect_delay(failures), exc.retry_after or 0)
                deadline.allows(wait, exc)
            time.sleep(wait)  # not before the Retry-After the API named

    def pages(self, path: str, after: int = 0) -> Iterator[dict[str, Any]]:
        """The receipts past `after` of the stream at `path` (`…/events`) as JSON, page after
        page until one comes back empty."""
        while True:
            page = self.request("GET", path, params={"after": after, "limit": PAGE})
            if not page["receipts"]:
                return
            for receipt in page["receipts"]:  # noqa: UP028 (no `yield from` in aio.py)
                yield receipt
            after = page["lastSeq"]

    def follow_raw(
        self, path: str, after: int = 0, name: str | None = None, deadline: Deadline = NEVER
    ) -> Iterator[dict[str, Any]]:
        """The receipts past `after` of the live event stream at `path`, as JSON, until its
        `end` event (a session's stream has none: until the caller stops), or `WaitTimedOut`
        at `deadline`.

        A dropped connection, a stream closed at the API's maximum lifetime, a 503 (or a proxy's
        502 or 504: `Unavailable`) or a 429 is resumed with `Last-Event-ID` (not before the
        `Retry-After` the API named), so no receipt is missed or repeated; after
        `RECONNECT_ATTEMPTS` failures in a row it raises the API's last 429 or 503
        (`RateLimited`, `Unavailable`) if the last try was refused so, else `ConnectionFailed`.
        A read never waits past `deadline`: a connection whose read timeout would outlast it is
        resumed with a shorter one."""
        last, failures, problem = after, 0, ""
        refused: ReceiptError | None = None  # the API's last 429 or 503, if it answered one
        while True:
            refused_now: ReceiptError | None = None
            headers = {"Accept": "text/event-stream", "Last-Event-ID": str(last)}
            problem = f"the stream ended before {name or path} did"
            read = deadline.read_timeout()
            shortened = False
            try:
                with self.http.stream(
                    "GET", path, headers=headers, timeout=stream_timeout(self.http.timeout, read)
                ) as response:
                    if response.status_code == 200:
                        kind = response.headers.get("content-type", "")
                        if not kind.startswith("text/event-stream"):
                            # A proxy's or a login page: not the API, and no reconnect mends it.
                            response.read()
                            raise ServerError(
                                f"{self.shown_url} answered GET {path} with "
                                f"{kind or 'no content type'}, not an event stream",
                                status=200,
                            )
                        for event in parse_sse(response.iter_lines(), keepalives=True):
                            failures = 0  # only a stream that sends something is a success
                            if event.name == "end":
                                return
                            if event.name == "message" and event.data:
                                receipt = json.loads(event.data)
                                if receipt["seq"] > last:
                                    last = receipt["seq"]
                                    yield receipt
                            if deadline.overrun():
                                deadline.allows(0)  # a stream that keeps sending: WaitTimedOut
                            if deadline.cuts(read):
                                shortened = True
                                break
                    else:
                        response.read()
                        error = error_of(response)
                        if not isinstance(error, Unavailable | RateLimited):
                            raise error
                        problem, refused_now = str(error), error
            except httpx.TransportError as exc:
                problem = str(exc) or type(exc).__name__
            if shortened:
                continue  # resumed with a read timeout that ends by the deadline
            deadline.allows(0)  # a read that timed out at the deadline is not a failure
            refused = refused_now
            failures += 1
            if failures > RECONNECT_ATTEMPTS:
                if refused is not None:
                    raise refused  # the API's own answer (e.g. its cap of open streams)
                raise ConnectionFailed(f"lost the event stream of {name or path}: {problem}")
            wait = reconnect_delay(failures)
            if refused is not None and refused.retry_after:
                wait = max(wait, refused.retry_after)  # as the API asked
            deadline.allows(wait, refused)
            time.sleep(wait)
