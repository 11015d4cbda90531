"""Steers handed to a running command: one JSON line each on its stdin, consumed once.

Every handler that runs a command feeds its stdin through a `StdinFeed`: first what the command
starts with (an agent turn's request line, a task's `stdin` text), then, while the command runs
and if it takes steers, each pending steer as `{"type": "steer", "commandId", "payload"}`. A
steer's `queue.command.consumed` is started in the same step as its write (no await between
them) and runs on to its end even when the feed is cancelled because the command ended;
`consumed()` waits for those writes before the handler returns, so a steer written is a steer
consumed, and one never written stays pending (settled `queue.command.unconsumed` if the job
ends without it). The feed wakes when the attempt hears a command appended to its job (the
`commands_arrived` event of the handler's context) and looks again every `STEER_POLL_S` all the
same.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from activities.handlers.context import HandlerContext
from receipts.waits import within

log = logging.getLogger("activities.handlers.steering")

STEER_POLL_S = 1.0


def steer_line(command_id: str, payload: Any) -> dict[str, Any]:
    """A steer handed to a running command on its stdin."""
    return {"type": "steer", "commandId": command_id, "payload": payload}


def encoded(line: dict[str, Any]) -> bytes:
    """One JSON line of a command's stdin protocol."""
    return (json.dumps(line, separators=(",", ":")) + "\n").encode()


class StdinFeed:
    """A running command's stdin: `preface` first, then, with `steers`, each steer once; without,
    stdin is closed after the preface (a command reading to the end of its input ends)."""

    def __init__(self, ctx: HandlerContext, preface: bytes, *, steers: bool) -> None:
        self.ctx = ctx
        self.preface = preface
        self.steers = steers
        self.consuming: list[asyncio.Future[bool]] = []

    async def feed(self, stdin: asyncio.StreamWriter) -> None:
        """Write the preface, then hand each steer to the command and consume it once."""
        stdin.write(self.preface)
        await stdin.drain()
        if not self.steers:
            stdin.close()
            return
        while True:
            for command in await self.ctx.pending_commands():
                if command.type != "steer":
                    continue
                stdin.write(encoded(steer_line(command.command_id, command.payload)))
                consume = asyncio.ensure_future(self.ctx.consume(command.command_id))
                self.consuming.append(consume)
                await stdin.drain()
                await asyncio.shield(consume)
                log.info(
                    "steer handed to the command",
                    extra={
                        "event": "handler.steered",
                        "jobId": self.ctx.job.job_id,
                        "commandId": command.command_id,
                    },
                )
            await self._next_look()

    async def _next_look(self) -> None:
        arrived = self.ctx.commands_arrived
        with contextlib.suppress(TimeoutError):
            await within(arrived.wait(), STEER_POLL_S)
        arrived.clear()

    async def consumed(self) -> None:
        """Wait for every steer handed to the command to be consumed (or refused by the fence)."""
        await asyncio.gather(*self.consuming, return_exceptions=True)
