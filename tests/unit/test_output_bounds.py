"""A command's output costs the worker bounded memory and work: the pace of reading it
(`OutputPace`, a token bucket) and what is kept of it (`ProgressOutput`, the last TAIL_CHARS)."""

from __future__ import annotations

from typing import Any

from activities.handlers.codex import TAIL_CHARS, TAIL_LINES, ProgressOutput
from activities.sandbox import OutputPace
from activities.sandbox_policy import OUTPUT_BURST_S


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_pace_lets_the_burst_through_then_waits_for_the_rate() -> None:
    clock = Clock()
    pace = OutputPace(1000, clock)
    assert pace.took(int(1000 * OUTPUT_BURST_S)) == 0.0  # the whole burst at once
    assert pace.took(500) == 0.5  # then half a second for 500 bytes
    clock.now += 0.5
    assert pace.took(250) == 0.25
    clock.now += 60  # an idle minute refills the burst, never more than it
    assert pace.took(int(1000 * OUTPUT_BURST_S)) == 0.0
    assert pace.took(1) > 0.0


class Progress:
    """The context's progress receipts, kept."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def progress(self, data: dict[str, Any]) -> None:
        self.sent.append(data)


async def test_output_without_end_keeps_only_the_tail_and_counts_every_line() -> None:
    progress = Progress()
    output = ProgressOutput(progress)  # type: ignore[arg-type]
    chunk = "y\n" * 32_768
    for _ in range(200):  # 13 MB, 6.5 million lines
        await output.write(chunk)
        assert len(output.recent) <= TAIL_CHARS
        assert len(output.unsent) <= TAIL_CHARS
    await output.write("last line, no newline")
    output.end()
    await output.flush()
    assert output.lines == 200 * 32_768 + 1
    tail = output.tail()
    assert tail.endswith("y\nlast line, no newline")
    assert len(tail.splitlines()) == TAIL_LINES
    assert all(len(sent["output"]) <= TAIL_CHARS for sent in progress.sent)
    assert progress.sent[-1] == {"output": progress.sent[-1]["output"], "lines": output.lines}
    assert progress.sent[-1]["output"].endswith("last line, no newline")


async def test_progress_carries_complete_lines_and_the_tail_is_the_last_lines() -> None:
    progress = Progress()
    output = ProgressOutput(progress)  # type: ignore[arg-type]
    await output.write("line 1\nline")  # the first write is sent at once (nothing sent yet)
    await output.write(" 2\nline 3\n")
    output.end()
    await output.flush()
    assert [sent["output"] for sent in progress.sent] == ["line 1\n", "line 2\nline 3\n"]
    assert output.tail() == "line 1\nline 2\nline 3\n"
    assert output.lines == 3
    long_line = "x" * (3 * TAIL_CHARS)
    await output.write(long_line + "\n")
    assert output.tail() == ("x" * (TAIL_CHARS - 1)) + "\n"


async def test_an_agent_turns_output_is_bounded_however_it_is_printed() -> None:
    """A turn's command printing without newlines was held whole, and each chunk re-joined and
    re-split with all of it (64 MiB took 32 s of the event loop): a line is kept up to
    MAX_LINE_CHARS, the lines kept up to MAX_HELD_CHARS, the unsent progress up to its tail.
    The outcome line after it is still read."""
    from activities.handlers import agent_turn

    turn = agent_turn._Turn(Progress())  # type: ignore[arg-type]
    chunk = "x" * 65_536
    for _ in range(1024):  # 64 MiB on one line
        await turn.output(chunk)
        assert len(turn.partial) <= agent_turn.MAX_LINE_CHARS
    lines = ("y" * 100_000 + "\n") * 100  # 10 MB of long lines
    await turn.output(lines)
    assert turn.held <= agent_turn.MAX_HELD_CHARS + agent_turn.MAX_LINE_CHARS
    assert turn.unsent_chars <= 2 * agent_turn.PROGRESS_CHARS
    await turn.output('{"outcome": "done", "result": 1}\n')
    assert (await turn.outcome(0))["outcome"] == "done"
    assert sum(len(line) for line in turn.lines) == turn.held <= agent_turn.MAX_HELD_CHARS
