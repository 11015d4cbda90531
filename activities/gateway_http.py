"""The AI gateway's HTTP plumbing: its sockets and server, a provider's answer relayed as it
comes (its usage read on the way), bounded request bodies, tokens read from either API style's
header, and errors shaped as each provider shapes them (`activities/gateway.py` decides)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import re
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import httpx
import pydantic_core
import uvicorn
from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

from activities.gateway_providers import Credential
from activities.gateway_usage import StreamUsage, Usage, recovers_at, usage_of

MAX_REQUEST_BYTES = 32 * 1024 * 1024
MAX_JSON_ANSWER_BYTES = 4 * 1024 * 1024
ANSWER_TAIL_BYTES = 64 * 1024
MAX_BODY_VALUES = 1_000_000  # JSON values a body may hold (its model is read by parsing it)
BYTES_PER_TOKEN = 4  # a prompt's tokens estimated from its body, where no usage says them
PASSED_ANSWER_HEADERS = ("content-type", "retry-after", "x-request-id", "request-id")


def bounded_h11(max_open: int, refused: Callable[[], object]) -> type[H11Protocol]:
    """uvicorn's h11 protocol holding at most `max_open` connections open at once: the next is
    closed as it is made (`refused()` called). `limit_concurrency` bounds the requests being
    served, not the connections: a turn's command opening connections and sending nothing held
    one descriptor each, until the worker had none left for any other job."""

    class BoundedH11(H11Protocol):
        turned_away = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if len(self.connections) >= max_open:
                self.turned_away = True
                refused()
                transport.abort()
                return
            super().connection_made(transport)

        def connection_lost(self, exc: Exception | None) -> None:
            if not self.turned_away:
                super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if not self.turned_away:
                super().data_received(data)

    return BoundedH11


class Relay:
    """A provider's answer passed through as it comes, its usage read on the way."""

    def __init__(
        self,
        upstream: httpx.Response,
        started: float,
        done: Callable[[str, Usage, float], None],
        style: str = "openai",
        sent: int = 0,
        key: str = "",
    ) -> None:
        self.upstream = upstream
        # An error answer may quote the request, its key with it (a proxy's, a provider's
        # message): written `***` before the command reads it (`_hidden`).
        self.hide = key.encode() if key and upstream.status_code >= 400 else b""
        self.held = b""
        self.style = style
        self.sent = sent  # the call's body, in bytes: its input, were a stream cut before its usage
        self.ended = False  # read to its end (a stream: not cut by the command's hang-up)
        self.started = started
        self.streamed = "text/event-stream" in upstream.headers.get("content-type", "")
        self.events = StreamUsage()
        self.kept = bytearray()
        self.tail = b""  # the last bytes past the kept head: its usage, where the head is cut off
        self.done = done
        self.closed = False

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.upstream.aiter_raw():
                if self.streamed:
                    self.events.feed(chunk)
                else:
                    if len(self.kept) < MAX_JSON_ANSWER_BYTES:
                        self.kept += chunk
                    else:  # past the kept head only: its last bytes, where its usage is
                        self.tail = (self.tail + chunk)[-ANSWER_TAIL_BYTES:]
                if sent := self._hidden(chunk) if self.hide else chunk:
                    yield sent
            self.ended = True
            if self.held:
                yield self.held
        except httpx.HTTPError as exc:
            if self.held:
                yield self.held
            if not self.streamed:
                raise  # a JSON answer cut short: the command's client sees it incomplete
            # A stream the provider stopped mid-way ends with an error event the command's
            # client reads (it was cut, and the worker logged a traceback for each).
            late = isinstance(exc, httpx.TimeoutException)
            yield stream_error(self.style, "the provider did not answer in time" if late else
                               "the provider's answer was cut short")  # fmt: skip

    def _hidden(self, chunk: bytes) -> bytes:
        """What of the error answer can be sent after `chunk`, its key written `***`: its last
        bytes are held until the next piece, which may end a key they begin."""
        text = (self.held + chunk).replace(self.hide, b"***")
        cut = max(0, len(text) - len(self.hide) + 1)
        self.held = text[cut:]
        return text[:cut]

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        await self.upstream.aclose()
        if self.streamed:
            usage = self.events.usage
            if not self.ended and not usage.input_tokens and self.upstream.status_code < 400:
                # Cut by the command's hang-up before its usage came (Chat Completions' and
                # Responses' come last): the provider read the prompt and bills it all the same,
                # and a command hanging up on each call spent without limit, counted at zero.
                usage.input_tokens = self.sent // BYTES_PER_TOKEN
        else:
            tail = (bytes(self.kept[-ANSWER_TAIL_BYTES:]) + self.tail)[-ANSWER_TAIL_BYTES:]
            usage = json_usage(bytes(self.kept), tail)
        self.done(str(self.upstream.status_code), usage, time.monotonic() - self.started)


class Relayed(StreamingResponse):
    """The relayed answer: what it holds (a credential's slot, a turn's call) is released
    (`release`) once its body is sent, or for a stream once the command hangs up.

    A JSON answer is read whole even when the command hung up before it came: the provider
    finishes and bills it either way, and its usage is in its body (the hang-up used to cut the
    read short and leave the call's cost out of the turn's usage). A stream is closed at the
    hang-up (the provider stops generating); what it cost past its last usage event is not known.
    """

    def __init__(self, relay: Relay, release: Callable[[], None]) -> None:
        upstream = relay.upstream
        super().__init__(
            relay.chunks(),
            status_code=upstream.status_code,
            headers={
                k: v for k, v in upstream.headers.items() if k.lower() in PASSED_ANSWER_HEADERS
            },
        )
        self.relay, self.release = relay, release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            if self.relay.streamed:
                await super().__call__(scope, receive, send)
            else:  # not watching for the hang-up: a send after it is dropped by the server
                await self.stream_response(send)
        finally:
            await self.relay.close()
            self.release()


class Server(uvicorn.Server):
    """uvicorn's server without its signal handlers: the role process owns them."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def socket_path() -> Path:
    """A new private path for a gateway's socket, in a directory the sandbox's uid can enter."""
    directory = Path(tempfile.mkdtemp(prefix="receipt-gateway-"))
    directory.chmod(0o755)
    return directory / "gateway.sock"


def bind(path: Path) -> socket.socket:
    """The gateway's listening Unix socket at `path`, connectable by the sandbox's uid (a call
    needs a turn's token all the same)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(str(path))
    path.chmod(0o666)
    listening.listen(128)
    listening.setblocking(False)
    return listening


async def bounded_body(request: Request, take: Callable[[int], bool]) -> bytes | None:
    """The request's body, or None past MAX_REQUEST_BYTES or once `take` (asked for each chunk's
    bytes as it arrives: the turn's budget) refuses (refused before it is read whole)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_REQUEST_BYTES:
        return None
    body = bytearray()
    async for chunk in request.stream():
        if not take(len(chunk)):
            return None
        body += chunk
        if len(body) > MAX_REQUEST_BYTES:
            return None
    return bytes(body)


class CallBody(BaseModel):
    """A call's body as the gateway reads it (pydantic-core's parser: nothing else is kept):
    the model it names, and the tools and MCP servers it asks the provider for."""

    model_config = ConfigDict(extra="ignore", strict=True)
    model: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    tools: Any = None
    mcp_servers: Any = None
    web_search_options: Any = None
    stream: Any = None
    background: Any = None

    def unserved(self, path: str, network_tools: bool) -> tuple[str, str] | None:
        """Why the gateway does not serve this call, as (reason, message), or None.

        `unmetered`: a background response (OpenAI's Responses API) answers at once, without
        its usage, and runs on at the provider past the turn: its tokens would be spent outside
        the organization's budget. `network_model` (unless the binding allows network tools): a
        search model (`gpt-4o-search-preview`, `…-search-api`) searches the web on every call,
        as the web search tool taken out of calls does, so a command could carry what it wrote
        to a host through it."""
        if path == "/v1/responses" and self.background not in (None, False):
            return "unmetered", (
                "`background` responses are not served: the gateway meters a call's tokens "
                "from its answer, and a background response's come after it (ask without it)"
            )
        if not network_tools and NETWORK_MODEL.search(self.model):
            return "network_model", (
                f"model {self.model!r} searches the web from the provider's side, which this "
                "binding does not allow (networkTools: false); use a model without search"
            )
        return None

    @property
    def network_tools(self) -> list[str]:
        """What the call asks the provider to reach the network with from its side: remote MCP
        servers (OpenAI's `mcp` tool, Anthropic's `mcp_servers` and `mcp_*` tools), web search
        (`web_search*` tools, Chat Completions' `web_search_options`) and web fetch
        (`web_fetch*`); a function tool runs in the command."""
        named = ["mcp_servers"] if self.mcp_servers else []
        named += ["web_search_options"] if self.web_search_options is not None else []
        tools = self.tools if isinstance(self.tools, list) else []
        return named + [family for tool in tools if (family := network_family(tool))]


NETWORK_TOOL_PREFIXES = ("mcp", "web_search", "web_fetch")
# Models that reach the web on every call, tools or none: OpenAI's search models.
NETWORK_MODEL = re.compile(r"(^|[-_./])search([-_./]|$)", re.IGNORECASE)


def network_family(tool: Any) -> str | None:
    """The family (`mcp`, `web_search`, `web_fetch`) of a tool the provider would run against
    the network, None for any other (a function tool runs in the command)."""
    kind = tool.get("type") if isinstance(tool, dict) else None
    if not isinstance(kind, str):
        return None
    return next((p for p in NETWORK_TOOL_PREFIXES if kind.startswith(p)), None)


def may_hide_tools(body: bytes) -> bool:
    """Whether a body names a key that can carry network tools more than once (JSON allows
    duplicates: the gateway reads the last, a provider might read another), so it is written
    again from its parse before it is forwarded. A key may be written with `\\u` escapes
    (`"tool\\u0073"` is `tools`, and no other escape spells a letter): such a body is written
    again too, its keys counted by no search of their bytes."""
    return b"\\u" in body or any(
        body.count(key) > 1 for key in (b'"tools"', b'"mcp_servers"', b'"web_search_options"')
    )


def without_network_tools(body: bytes) -> bytes:
    """`body` with its network tools and `mcp_servers` taken out (a `tools` left empty goes
    too); the rest as it was, read and written as JSON."""
    parsed = _parsed(body)
    parsed.pop("mcp_servers", None)
    parsed.pop("web_search_options", None)
    tools = [t for t in parsed.pop("tools", None) or [] if network_family(t) is None]
    if tools:
        parsed["tools"] = tools
    return pydantic_core.to_json(parsed)


def with_usage_asked(path: str, body: bytes) -> bytes:
    """A streamed call's body, if a Chat Completions one, asking for its usage: OpenAI sends a
    streamed answer's usage (a last chunk with no choices) only when
    `stream_options.include_usage` is true, and a command that left it out had its calls counted
    at zero tokens. (Responses and Messages streams always carry their usage.)"""
    if path != "/v1/chat/completions":
        return body
    parsed = _parsed(body)
    options = parsed.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return body
    kept = options if isinstance(options, dict) else {}
    parsed["stream_options"] = {**kept, "include_usage": True}
    return pydantic_core.to_json(parsed)


def _parsed(body: bytes) -> dict[str, Any]:
    """A body `call_of` read as a JSON object, parsed to be written again. pydantic-core's parser
    and writer, not the json module's: a body of 1 000 000 numbers took that 3 s to read and
    write (23 MiB of floats), the worker's event loop held all along — every other turn's
    stream, every heartbeat — and a command sends one per call; these take a tenth of it."""
    parsed = pydantic_core.from_json(body)
    assert isinstance(parsed, dict)  # `call_of` read a JSON object
    return parsed


def call_of(body: bytes) -> CallBody | None:
    """The call a body makes: its top-level `model` (both APIs), as the provider reads it (the
    last one if named twice; never one nested deeper), and its tools; None when the body is no
    JSON object naming a model."""
    try:
        return CallBody.model_validate_json(body)
    except ValidationError:
        return None


def too_many_values(body: bytes) -> bool:
    """Whether the body may hold more than MAX_BODY_VALUES JSON values (counted from its `{`, `[`
    and `,`, those in strings too): parsing one of 32 MiB of empty objects took seconds and
    hundreds of MiB, far past any model call's body (a long context is a few MiB of text)."""
    count = body.count(b",")
    return count > MAX_BODY_VALUES or count + body.count(b"{") + body.count(b"[") > MAX_BODY_VALUES


def recovery(upstream: httpx.Response) -> datetime | None:
    try:
        return recovers_at(upstream.headers, datetime.now(UTC))
    except (OverflowError, ValueError):  # a reset too far to name: as none
        return None


def same_token(given: str, expected: str) -> bool:
    """Whether a call's token is its turn's, compared in constant time (how long the compare
    takes tells nothing of how much of a guess was right)."""
    return hmac.compare_digest(given.encode(), expected.encode())


def token_of(request: Request) -> str:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key", "").strip()


def json_usage(body: bytes, tail: bytes = b"") -> Usage:
    """The tokens of a JSON answer: from the whole of it when `body` (its first
    MAX_JSON_ANSWER_BYTES) is all of it, else from the last `"usage"` object of its `tail`
    (all three APIs write usage after the content, so a long answer's usage is at its end)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return _tail_usage(tail)
    return usage_of(parsed) if isinstance(parsed, Mapping) else Usage()


def _tail_usage(tail: bytes) -> Usage:
    text = tail.decode("utf-8", errors="replace")
    at = text.rfind('"usage"')
    start = text.find("{", at) if at >= 0 else -1
    if start < 0:
        return Usage()
    try:
        usage, _ = json.JSONDecoder().raw_decode(text, start)
    except ValueError:
        return Usage()
    return usage_of({"usage": usage}) if isinstance(usage, Mapping) else Usage()


def redacted(text: str, credential: Credential) -> str:
    return text.replace(str(credential.key), "***") if credential.key else text


def stream_error(style: str, message: str) -> bytes:
    """An error event ending a stream, as the provider of `style` sends one."""
    if style == "anthropic":
        event = {"type": "error", "error": {"type": "api_error", "message": message}}
        return b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"
    event = {"type": "error", "error": {"message": message, "type": "api_error", "code": None}}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def error(
    style: str, status: int, kind: str, message: str, retry_after: int | None = None
) -> Response:
    """An error as the provider of `style` shapes it, so the command's client reads it."""
    headers = {"retry-after": str(retry_after)} if retry_after is not None else None
    if style == "anthropic":
        body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        body = {"error": {"message": message, "type": kind, "code": kind}}
    return JSONResponse(body, status_code=status, headers=headers)
