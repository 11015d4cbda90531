"""Server-sent events: parsing `text/event-stream` lines, and the reconnect policy every
followed stream shares (resume after the last seq with `Last-Event-ID`)."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field

RECONNECT_ATTEMPTS = 8
KEEPALIVE = "keepalive"  # the name `parse_sse` gives a comment line when asked for them


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One server-sent event: its name (`message` unless named), data and id."""

    name: str
    data: str
    id: str | None


@dataclass
class _Parser:
    name: str = "message"
    event_id: str | None = None
    data: list[str] = field(default_factory=list)

    def feed(self, line: str, keepalives: bool = False) -> SseEvent | None:
        if line == "":
            event = None
            if self.data or self.name != "message":
                event = SseEvent(self.name, "\n".join(self.data), self.event_id)
            self.name, self.event_id, self.data = "message", None, []
            return event
        if line.startswith(":"):
            return SseEvent(KEEPALIVE, line[1:].strip(), None) if keepalives else None
        key, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if key == "data":
            self.data.append(value)
        elif key == "event":
            self.name = value
        elif key == "id":
            self.event_id = value
        return None


def parse_sse(lines: Iterable[str], keepalives: bool = False) -> Iterator[SseEvent]:
    """Events of `text/event-stream` lines (`retry:` skipped; comments, the API's keepalives,
    skipped too unless `keepalives`: then each is an event named `KEEPALIVE`)."""
    parser = _Parser()
    for line in lines:
        event = parser.feed(line, keepalives)
        if event is not None:
            yield event


async def parse_sse_async(
    lines: AsyncIterable[str], keepalives: bool = False
) -> AsyncIterator[SseEvent]:
    """`parse_sse` over an async iterable of lines."""
    parser = _Parser()
    async for line in lines:
        event = parser.feed(line, keepalives)
        if event is not None:
            yield event


def reconnect_delay(failures: int) -> float:
    """Seconds before reconnect number `failures` (growing, at most 5 s)."""
    return min(0.25 * 2**failures, 5.0)
