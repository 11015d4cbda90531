"""A turn's stdin feed: a steer written just before the command ends is still consumed.

The feed is cancelled when the command ends; a steer handed to the turn a moment before must
not lose its `queue.command.consumed` to that cancellation (the handler waits for it before the
turn settles). The context is a small fake: only the feed's own plumbing is under test here;
the delivery test with a real turn is `integration/delivery/test_agent_jobs_delivery.py`.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from activities.handlers import agent_turn
from receipts.commands import QueuedCommand
from receipts.jobs import Command


class SlowConsumer:
    """Hands out one pending steer; consuming it takes a while (a database round trip)."""

    def __init__(self) -> None:
        self.steer = QueuedCommand(
            Command(command_id="cmd-1", type="steer", recorded_at=datetime.now(UTC)),
            {"say": "left"},
        )
        self.consuming = asyncio.Event()
        self.consumed: list[str] = []

    async def pending_commands(self) -> tuple[QueuedCommand, ...]:
        return () if self.consumed or self.consuming.is_set() else (self.steer,)

    async def consume(self, command_id: str) -> bool:
        self.consuming.set()
        await asyncio.sleep(0.2)
        self.consumed.append(command_id)
        return True


async def test_a_steer_written_just_before_the_turn_ends_is_still_consumed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(agent_turn, "STEER_POLL_S", 0.0)
    ctx: Any = SlowConsumer()
    turn = agent_turn._Turn(ctx, {"type": "turn"})
    reader = await asyncio.create_subprocess_exec(
        "cat", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert reader.stdin is not None and reader.stdout is not None
    feeding = asyncio.create_task(turn.feed(reader.stdin))
    await asyncio.wait_for(ctx.consuming.wait(), 5)
    feeding.cancel()  # the command ended: run_sandboxed cancels the feed
    with pytest.raises(asyncio.CancelledError):
        await feeding
    await turn.consumed()
    assert ctx.consumed == ["cmd-1"]
    reader.stdin.close()
    lines = [json.loads(line) for line in (await reader.stdout.read()).splitlines()]
    await reader.wait()
    assert [line["type"] for line in lines] == ["turn", "steer"]
    assert lines[1]["commandId"] == "cmd-1"
