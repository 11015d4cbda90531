"""A command's stdin feed: the preface, then steers, each consumed once — also one written just
before the command ends; and a command that takes no steers gets its stdin closed.

The feed is cancelled when the command ends; a steer handed to the command a moment before must
not lose its `queue.command.consumed` to that cancellation (the handler waits for it before it
returns). The context is a small fake: only the feed's own plumbing is under test here; the
delivery tests with real commands are `integration/delivery/test_agent_jobs_delivery.py` and
`integration/delivery/test_commands.py`.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from activities.handlers import steering
from activities.handlers.steering import StdinFeed, encoded
from receipts.commands import QueuedCommand
from receipts.jobs import Command


class SlowConsumer:
    """Hands out one pending steer; consuming it takes a while (a database round trip)."""

    def __init__(self) -> None:
        self.job = SimpleNamespace(job_id="j-1")
        self.commands_arrived = asyncio.Event()
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


async def cat() -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        "cat", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )


async def test_a_steer_written_just_before_the_command_ends_is_still_consumed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(steering, "STEER_POLL_S", 0.0)
    ctx: Any = SlowConsumer()
    feed = StdinFeed(ctx, encoded({"type": "turn"}), steers=True)
    reader = await cat()
    assert reader.stdin is not None and reader.stdout is not None
    feeding = asyncio.create_task(feed.feed(reader.stdin))
    await asyncio.wait_for(ctx.consuming.wait(), 5)
    feeding.cancel()  # the command ended: run_sandboxed cancels the feed
    with pytest.raises(asyncio.CancelledError):
        await feeding
    await feed.consumed()
    assert ctx.consumed == ["cmd-1"]
    reader.stdin.close()
    lines = [json.loads(line) for line in (await reader.stdout.read()).splitlines()]
    await reader.wait()
    assert [line["type"] for line in lines] == ["turn", "steer"]
    assert lines[1] == {"type": "steer", "commandId": "cmd-1", "payload": {"say": "left"}}


async def test_a_command_that_takes_no_steers_reads_its_preface_to_the_end() -> None:
    ctx: Any = SlowConsumer()
    feed = StdinFeed(ctx, b"the prompt\n", steers=False)
    reader = await cat()
    assert reader.stdin is not None and reader.stdout is not None
    await asyncio.wait_for(feed.feed(reader.stdin), 5)
    assert await asyncio.wait_for(reader.stdout.read(), 5) == b"the prompt\n"  # EOF came
    await reader.wait()
    assert ctx.consumed == [] and not ctx.consuming.is_set()


async def test_the_feed_looks_again_as_soon_as_a_command_arrives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(steering, "STEER_POLL_S", 3600.0)  # only the event can wake it
    ctx: Any = SlowConsumer()
    looks = 0
    first_look = asyncio.Event()
    real = ctx.pending_commands

    async def counted() -> tuple[QueuedCommand, ...]:
        nonlocal looks
        looks += 1
        first_look.set()
        return () if looks == 1 else await real()

    ctx.pending_commands = counted
    feed = StdinFeed(ctx, b"", steers=True)
    reader = await cat()
    assert reader.stdin is not None
    feeding = asyncio.create_task(feed.feed(reader.stdin))
    await asyncio.wait_for(first_look.wait(), 5)  # it found nothing; it waits for the event now
    ctx.commands_arrived.set()
    await asyncio.wait_for(ctx.consuming.wait(), 5)
    feeding.cancel()
    await asyncio.gather(feeding, return_exceptions=True)
    await feed.consumed()
    assert ctx.consumed == ["cmd-1"]
    reader.stdin.close()
    await reader.wait()
