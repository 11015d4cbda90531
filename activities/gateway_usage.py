"""What the AI gateway reads of a provider's answer, without keeping it: the tokens a call used
(from a JSON body or a server-sent event stream, in each API style) and, of a refusal for quota,
when the provider says it recovers."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

# OpenAI's reset headers read "1s", "6m0s", "20ms", "1h2m3.5s".
_DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+(?:\.\d+)?)s)?(?:(\d+)ms)?$")
RESET_HEADERS = (
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-input-tokens-reset",
    "anthropic-ratelimit-output-tokens-reset",
)


@dataclass
class Usage:
    """Tokens in and out of one call (in: Anthropic's prompt-cache writes and reads too)."""

    input_tokens: int = 0
    output_tokens: int = 0


def usage_of(body: Mapping[str, Any]) -> Usage:
    """The tokens of a JSON answer (Chat Completions, Responses or Messages) or of one event."""
    usage = body.get("usage")
    if not isinstance(usage, Mapping):
        response = body.get("response") or body.get("message")
        usage = response.get("usage") if isinstance(response, Mapping) else None
    if not isinstance(usage, Mapping):
        return Usage()
    tokens_in = _int(usage.get("input_tokens", usage.get("prompt_tokens", 0)))
    # Anthropic counts the prompt cache's writes and reads apart from `input_tokens`; they are
    # input all the same (OpenAI's `prompt_tokens` and `input_tokens` include cached ones).
    for cached in ("cache_creation_input_tokens", "cache_read_input_tokens"):
        tokens_in += _int(usage.get(cached, 0))
    tokens_out = usage.get("output_tokens", usage.get("completion_tokens", 0))
    return Usage(tokens_in, _int(tokens_out))


class StreamUsage:
    """The tokens of a streamed answer, read from its events as the bytes pass through.

    Chat Completions sends them in its last chunk, Responses in `response.completed`, Messages
    its input in `message_start` and its output, cumulative, in each `message_delta`."""

    MAX_LINE = 1 << 20

    def __init__(self) -> None:
        self.usage = Usage()
        self._partial = b""

    def feed(self, chunk: bytes) -> None:
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        if len(self._partial) > self.MAX_LINE:  # a line this long carries no usage we read
            self._partial = b""
        for line in lines:
            if line.startswith(b"data:"):
                self._event(line[5:].strip())

    def _event(self, data: bytes) -> None:
        if not data or data == b"[DONE]" or b"usage" not in data:
            return
        try:
            event = json.loads(data)
        except ValueError:
            return
        if not isinstance(event, Mapping):
            return
        seen = usage_of(event)
        if event.get("type") == "message_delta":  # Anthropic: output only, cumulative
            self.usage.output_tokens = max(self.usage.output_tokens, seen.output_tokens)
            return
        if seen.input_tokens:
            self.usage.input_tokens = seen.input_tokens
        if seen.output_tokens:
            self.usage.output_tokens = seen.output_tokens


def recovers_at(headers: Mapping[str, str], now: datetime) -> datetime | None:
    """When a provider that refused for quota (429) says it recovers: `retry-after` (seconds or
    an HTTP date), else the latest of its rate-limit reset headers; None when it says nothing."""
    after = headers.get("retry-after")
    if after:
        try:
            return now + timedelta(seconds=max(0.0, float(after)))
        except ValueError:
            try:
                return parsedate_to_datetime(after).astimezone(UTC)
            except (TypeError, ValueError):
                pass
    resets = [at for name in RESET_HEADERS if (at := _reset(headers.get(name), now)) is not None]
    return max(resets) if resets else None


def _reset(value: str | None, now: datetime) -> datetime | None:
    if not value:
        return None
    value = value.strip()
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        pass
    match = _DURATION.match(value)
    if not match or not any(match.groups()):
        return None
    hours, minutes, seconds, millis = match.groups()
    delta = timedelta(
        hours=int(hours or 0),
        minutes=int(minutes or 0),
        seconds=float(seconds or 0),
        milliseconds=int(millis or 0),
    )
    return now + delta


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
