#!/usr/bin/env python3
"""The demo agent of `make up`: the turn protocol of a background agent job (docs/agent-jobs.md).

Its first turn reports progress, takes any steer sent in its first second, and asks what to call
the summary (`needs_input`); the turn that continues with the answer writes the summary into the
job's workspace, follow-ups included, and is done. Standard library only.
"""

import json
import select
import sys
import time
from pathlib import Path


def say(outcome: dict) -> None:
    """The turn's outcome: the last JSON line of its output."""
    print(json.dumps(outcome), flush=True)


def steers(seconds: float) -> list:
    """The steer lines that arrive on stdin within `seconds` (one JSON object each)."""
    found = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([sys.stdin], [], [], left)
        if not ready:
            break
        line = sys.stdin.readline()
        if not line:
            break
        found.append(json.loads(line).get("payload"))
    return found


def main() -> int:
    request = json.loads(sys.stdin.readline())
    prompt = request.get("prompt") or "(no prompt)"
    print(f"turn {request['turn']} of attempt {request['attempt']}: {prompt}", flush=True)
    steered = steers(1.0)
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
