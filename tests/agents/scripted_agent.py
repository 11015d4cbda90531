#!/usr/bin/env python3
"""A scripted agent for the tests: reads the turn request on stdin, does what its prompt says,
and prints one outcome as the last JSON line of stdout (the turn protocol, docs/agent-jobs.md).

Prompts: `done:<text>`; `ask:<question>` (needs_input on the first turn, done with the answer
on the continuation); `fail` / `fail-hard` (retryable / not); `fail-delay:<ms>`; `crash` (exit 3,
no outcome); `quota:<seconds>` (quota_exhausted with retryAt once, then done); `quota-bare`;
`sleep:<seconds>` (then done); `mark:<seconds>` (then writes `marker` in its workspace, then
done); `model:<n>` (n calls to its model through the AI gateway, then done with the answers; a
refusal crashes it, exit 4, no outcome); `slow-ask:<seconds>` (then needs_input); `steer` (wait
for a steer line, then done with its payload); `agents-md` (done with the workspace's
AGENTS.md); `whoami:<path>` (its uid, whether it sees <path>, its environment's names). A
turn with follow-ups answers them.
"""

import json
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path


def emit(outcome: dict) -> None:
    print("working...", flush=True)
    print(json.dumps(outcome), flush=True)


def main() -> int:
    request = json.loads(sys.stdin.readline())
    prompt = request.get("prompt") or ""
    mode, _, arg = prompt.partition(":")
    if request.get("followUps"):
        emit(
            {
                "outcome": "done",
                "result": {"followUps": request["followUps"], "turn": request["turn"]},
            }
        )
        return 0
    if mode == "done":
        emit({"outcome": "done", "result": {"text": arg, "turn": request["turn"]}})
    elif mode == "ask":
        if "answer" in request:
            emit({"outcome": "done", "result": {"answer": request["answer"]}})
        else:
            emit(
                {"outcome": "needs_input", "question": arg, "toolCallId": f"call-{request['turn']}"}
            )
    elif mode == "fail":
        emit({"outcome": "failed", "error": "scripted failure"})
    elif mode == "fail-hard":
        emit({"outcome": "failed", "error": "scripted fatal failure", "retryable": False})
    elif mode == "fail-delay":
        emit({"outcome": "failed", "error": "scripted failure", "retryDelayMs": int(arg)})
    elif mode == "crash":
        print("not json at all", flush=True)
        return 3
    elif mode == "quota":
        marker = Path("quota-used")
        if marker.exists():
            emit({"outcome": "done", "result": {"afterQuota": True}})
        else:
            marker.write_text("1")
            retry_at = datetime.now(UTC) + timedelta(seconds=float(arg))
            emit({"outcome": "quota_exhausted", "retryAt": retry_at.isoformat()})
    elif mode == "quota-bare":
        emit({"outcome": "quota_exhausted"})
    elif mode == "sleep":
        time.sleep(float(arg))
        emit({"outcome": "done", "result": {"slept": float(arg)}})
    elif mode == "slow-ask":
        time.sleep(float(arg))
        emit({"outcome": "needs_input", "question": "go on?", "toolCallId": "call-slow"})
    elif mode == "mark":
        time.sleep(float(arg))
        Path("marker").write_text("the turn ran to its end")
        emit({"outcome": "done", "result": {"marked": True}})
    elif mode == "steer":
        line = sys.stdin.readline()
        steer = json.loads(line) if line else None
        time.sleep(float(arg or 0))
        emit({"outcome": "done", "result": {"steer": steer}})
    elif mode == "whoami":
        import os

        visible = Path(arg).exists()
        emit(
            {
                "outcome": "done",
                "result": {"uid": os.getuid(), "sees": visible, "env": sorted(os.environ)},
            }
        )
    elif mode == "model":
        import os
        import urllib.error
        import urllib.request

        answers = []
        for _ in range(int(arg)):
            call = urllib.request.Request(
                os.environ["OPENAI_BASE_URL"] + "/chat/completions",
                data=json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode(),
                headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                         "Content-Type": "application/json"},
            )  # fmt: skip
            try:
                answer = json.load(urllib.request.urlopen(call, timeout=20))
            except urllib.error.HTTPError as exc:
                print(f"the model refused: {exc.code}", flush=True)
                return 4
            answers.append(answer["choices"][0]["message"]["content"])
        emit({"outcome": "done", "result": {"answers": answers}})
    elif mode == "agents-md":
        emit({"outcome": "done", "result": {"agentsMd": Path("AGENTS.md").read_text()}})
    else:
        emit(
            {
                "outcome": "failed",
                "error": f"unknown scripted prompt {prompt!r}",
                "retryable": False,
            }
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
