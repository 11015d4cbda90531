#!/usr/bin/env python3
"""The demo agent of `make up`: the turn protocol of a background agent job (docs/agent-jobs.md).

Its first turn reports progress, takes any steer sent in its first second, and asks what to call
the summary (`needs_input`); the turn that continues with the answer writes the summary into the
job's workspace, follow-ups included, and is done. Standard library only.
"""

import json
import os
import select
import sys
import time
from pathlib import Path


def say(outcome: dict) -> None:
    """The turn's outcome: the last JSON line of its output."""
    print(json.dumps(outcome), flush=True)


class Lines:
    """stdin's lines, read from the descriptor into a buffer of its own: `select` sees only what
    the descriptor holds, so lines `sys.stdin` had already buffered (a steer that came with the
    request line, or two steers in one read) would never be seen."""

    def __init__(self) -> None:
        self.buffer = b""
        self.closed = False

    def next(self, timeout: float | None) -> str | None:
        """The next line, waiting up to `timeout` seconds (None: for ever); None when none."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buffer and not self.closed:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            ready, _, _ = select.select([0], [], [], left)
            if not ready:
                return None
            chunk = os.read(0, 65536)
            self.buffer += chunk
            self.closed = not chunk
        if b"\n" not in self.buffer:
            line, self.buffer = self.buffer, b""
            return line.decode() or None
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()


def steers(stdin: Lines, seconds: float) -> list:
    """The steer lines that arrive on stdin within `seconds` (one JSON object each)."""
    found = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        line = stdin.next(left)
        if line is None:
            break
        if line.strip():
            found.append(json.loads(line).get("payload"))
    return found


def main() -> int:
    stdin = Lines()
    request = json.loads(stdin.next(None) or "{}")
    prompt = request.get("prompt") or "(no prompt)"
    print(f"turn {request['turn']} of attempt {request['attempt']}: {prompt}", flush=True)
    steered = steers(stdin, 1.0)
    for steer in steered:
        print(f"steered: {json.dumps(steer)}", flush=True)
    answer = request.get("answer")
    if answer is None:
        say(
            {
                "outcome": "needs_input",
                "question": "What should the summary file be called?",
                "toolCallId": f"name-{request['attempt']}",
            }
        )
        return 0
    name = Path(str(answer["answer"])).name or "summary.md"
    lines = [f"# {prompt}", "", f"Asked by the owner session; named {name!r} by its answer."]
    lines += [f"- follow-up: {json.dumps(f)}" for f in request.get("followUps") or []]
    lines += [f"- steer: {json.dumps(s)}" for s in steered]
    Path(name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {name} ({len(lines)} lines)", flush=True)
    say({"outcome": "done", "result": {"file": name, "lines": len(lines)}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
