"""A model provider on loopback for the AI gateway's tests: OpenAI's Chat Completions and
Responses and Anthropic's Messages, streaming or not, with the usage a real one reports.

Every call is checked against the provider's keys (`keys`: key → behaviour): `ok` answers;
`quota` answers 429 with `retry-after: quota_s`; `forbidden` answers 403 (a model the key may not
use); `slow` answers after `slow_s` (a JSON body `slow_body_s` after its headers); `chat-only`
answers 401 on `/v1/responses` (a restricted key without that endpoint's scope) and as `ok`
elsewhere; anything else is 401. The Responses API follows
a script an agent CLI can run: while no tool output is in the input it calls the shell tool
(`exec_command`, the command `shell_command`), then it answers with a final message. Each call is
recorded (path, the key it carried, whether it streamed), never its body's secrets.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

USAGE_IN, USAGE_OUT = 11, 7


@dataclass
class Call:
    path: str
    key: str
    stream: bool
    # What the call asked the provider to run (tools' types, `mcp_servers` when given).
    tools: tuple[str, ...] = ()


@dataclass
class FakeProvider:
    keys: dict[str, str]
    shell_command: str = "echo hi > out.txt"
    quota_s: int = 30
    slow_s: float = 1.0
    slow_body_s: float = 0.0
    # Models at their rate limit for every key (a provider limits rates per model): 429.
    limited_models: set[str] = field(default_factory=set)
    # As OpenAI: a streamed chat completion carries its usage only when the call asks for it
    # (`stream_options.include_usage`); off, every streamed one carries it.
    usage_when_asked: bool = False
    trickle_s: float = 0.2  # `trickle`: a stream that never ends, an event this often
    huge_bytes: int = 0  # `huge`: a stream of about this many bytes of content
    calls: list[Call] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)  # each call's body as it arrived
    port: int = 0
    sent: int = 0  # of a `huge` stream, the bytes written before it ended or was hung up on

    @property
    def openai_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def running(provider: FakeProvider) -> Iterator[FakeProvider]:
    """Serve `provider` on a free loopback port until the block ends."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(provider))
    provider.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield provider
    finally:
        server.shutdown()
        server.server_close()


def _handler(provider: FakeProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        body_after_s = 0.0  # a pause between an answer's headers and its body

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            provider.bodies.append(raw)
            body = json.loads(raw)
            auth = self.headers.get("authorization", "")
            key = auth.removeprefix("Bearer ") if auth else self.headers.get("x-api-key", "")
            stream = bool(body.get("stream"))
            tools = tuple(str(t.get("type")) for t in body.get("tools") or [])
            tools += ("mcp_servers",) if "mcp_servers" in body else ()
            provider.calls.append(Call(self.path, key, stream, tools))
            behaviour = provider.keys.get(key)
            if behaviour is None or (behaviour == "chat-only" and self.path == "/v1/responses"):
                return self._json(401, {"error": {"message": "invalid key", "type": "auth"}})
            if behaviour == "quota" or body.get("model") in provider.limited_models:
                extra = {"retry-after": str(provider.quota_s)}
                return self._json(429, {"error": {"message": "quota", "type": "rate"}}, extra)
            if behaviour == "forbidden":
                return self._json(403, {"error": {"message": "not this model", "type": "perm"}})
            if behaviour == "slow":
                time.sleep(provider.slow_s)
                self.body_after_s = provider.slow_body_s
            if behaviour == "trickle":
                return self._trickle()
            if behaviour == "huge":
                return self._huge()
            if self.path == "/v1/chat/completions":
                return self._chat(body, stream)
            if self.path == "/v1/responses":
                return self._responses(body)
            if self.path == "/v1/messages":
                return self._messages(stream)
            return self._json(404, {"error": {"message": self.path}})

        def _chat(self, body: dict[str, Any], stream: bool) -> None:
            usage = {"prompt_tokens": USAGE_IN, "completion_tokens": USAGE_OUT}
            if not stream:
                message = {"role": "assistant", "content": "hello"}
                return self._json(200, {"choices": [{"message": message}], "usage": usage})
            options = body.get("stream_options") or {}
            asked = options.get("include_usage") is True or not provider.usage_when_asked
            self._events(
                [
                    {"choices": [{"delta": {"content": "hel"}}]},
                    {"choices": [{"delta": {"content": "lo"}}]},
                    *([{"choices": [], "usage": usage}] if asked else []),
                ],
                done=True,
            )

        def _endless_stream(self) -> None:
            """The head of a stream (it ends when the provider closes the connection)."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

        def _trickle(self) -> None:
            self._endless_stream()
            event = b'data: {"choices": [{"delta": {"content": "."}}]}\n\n'
            try:
                while True:
                    self.wfile.write(event)
                    self.wfile.flush()
                    time.sleep(provider.trickle_s)
            except OSError:
                return  # the gateway hung up

        def _huge(self) -> None:
            self._endless_stream()
            event = b'data: {"choices": [{"delta": {"content": "' + b"x" * 65000 + b'"}}]}\n\n'
            sent = 0
            try:
                while sent < provider.huge_bytes:
                    self.wfile.write(event)
                    sent += len(event)
                provider.sent = sent
            except OSError:
                provider.sent = sent

        def _responses(self, body: dict[str, Any]) -> None:
            items = body.get("input") or []
            answered = any(str(i.get("type", "")).endswith("_call_output") for i in items)
            if answered:
                item: dict[str, Any] = {
                    "type": "message",
                    "role": "assistant",
                    "id": "msg_1",
                    "content": [{"type": "output_text", "text": "Done: wrote out.txt"}],
                }
            else:
                arguments = {"cmd": provider.shell_command, "login": False}
                item = {
                    "type": "function_call",
                    "id": "fc_1",
                    "call_id": "call_1",
                    "name": "exec_command",
                    "arguments": json.dumps(arguments),
                }
            usage = {
                "input_tokens": USAGE_IN,
                "input_tokens_details": None,
                "output_tokens": USAGE_OUT,
                "output_tokens_details": None,
                "total_tokens": USAGE_IN + USAGE_OUT,
            }
            rid = f"resp_{int(answered)}"
            self._events(
                [
                    {"type": "response.created", "response": {"id": rid}},
                    {"type": "response.output_item.done", "output_index": 0, "item": item},
                    {"type": "response.completed", "response": {"id": rid, "usage": usage}},
                ]
            )

        def _messages(self, stream: bool) -> None:
            if not stream:
                usage = {"input_tokens": USAGE_IN, "output_tokens": USAGE_OUT}
                content = [{"type": "text", "text": "hello"}]
                return self._json(200, {"type": "message", "content": content, "usage": usage})
            start = {"usage": {"input_tokens": USAGE_IN, "output_tokens": 1}}
            delta = {"type": "text_delta", "text": "hello"}
            self._events(
                [
                    {"type": "message_start", "message": start},
                    {"type": "content_block_delta", "delta": delta},
                    {"type": "message_delta", "usage": {"output_tokens": USAGE_OUT}},
                    {"type": "message_stop"},
                ]
            )

        def _json(self, status: int, body: Any, extra: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (extra or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.flush()
            time.sleep(self.body_after_s)
            self.wfile.write(data)

        def _events(self, events: list[dict[str, Any]], done: bool = False) -> None:
            self._endless_stream()
            for event in events:
                name = f"event: {event['type']}\n" if "type" in event else ""
                self.wfile.write(f"{name}data: {json.dumps(event)}\n\n".encode())
                self.wfile.flush()
            if done:
                self.wfile.write(b"data: [DONE]\n\n")

    return Handler
