#!/usr/bin/env python3
"""The turn protocol around OpenAI's Codex CLI (`@openai/codex`, checked with 0.171.0): an agent
of RECEIPT_AGENTS_FILE whose `command` is this script runs one `codex exec` per turn, in the
job's workspace, its model calls through Receipt's AI gateway.

In: the turn request on stdin (docs/agent-jobs.md); `CODEX_BIN`, the codex executable (install it
where the sandbox sees it: a directory in RECEIPT_SANDBOX_RO_BINDS); `CODEX_MODEL` (default
gpt-5.5); `OPENAI_BASE_URL` and `OPENAI_API_KEY`, the gateway's address and the turn's token,
which Receipt sets (no provider key ever reaches the sandbox). Out: what codex does, line by
line, as the turn's progress, then one outcome line — `done`
with codex's last message and usage, or `failed` with its error (a model refused for quota is
`quota_exhausted`: Receipt's gateway knows until when).

Codex runs with its own sandbox and approvals off (Receipt's sandbox confines it), without
analytics or plugins (no network but the gateway), its state in `.codex-home` in the workspace.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def emit(outcome: dict) -> int:
    print(json.dumps(outcome), flush=True)
    return 0


def prompt_of(request: dict) -> str:
    prompt = request.get("prompt") or ""
    if "answer" in request:
        prompt += f"\n\nYour user answered: {json.dumps(request['answer'].get('answer'))}"
    for follow_up in request.get("followUps") or []:
        prompt += f"\n\nYour user adds: {json.dumps(follow_up)}"
    return prompt


def configure(home: Path) -> None:
    home.mkdir(exist_ok=True)
    model = os.environ.get("CODEX_MODEL", "gpt-5.5")
    (home / "config.toml").write_text(
        f'model = "{model}"\n'
        'model_provider = "receipt"\n'
        "[analytics]\nenabled = false\n"
        "[features]\nplugins = false\n"
        "[model_providers.receipt]\n"
        'name = "Receipt AI gateway"\n'
        f'base_url = "{os.environ["OPENAI_BASE_URL"]}"\n'
        'env_key = "OPENAI_API_KEY"\n'
        'wire_api = "responses"\n'
        "request_max_retries = 0\n"
        "stream_max_retries = 0\n",
        encoding="utf-8",
    )


def main() -> int:
    request = json.loads(sys.stdin.readline())
    if "OPENAI_BASE_URL" not in os.environ:
        return emit({"outcome": "failed", "error": "no model gateway for this agent (set its "
                     "providerBinding)", "retryable": False})  # fmt: skip
    home = Path(".codex-home").absolute()
    configure(home)
    codex = subprocess.Popen(
        [
            os.environ.get("CODEX_BIN", "codex"),
            "exec", "--json", "--ephemeral", "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "-C", os.getcwd(),
            "--",  # the prompt is the tenant's: never an option
            prompt_of(request),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=(stderr_file := tempfile.TemporaryFile(mode="w+")),
        text=True,
        env={**os.environ, "CODEX_HOME": str(home)},
    )  # fmt: skip
    messages, usage, errors = [], None, []
    assert codex.stdout is not None
    for line in codex.stdout:  # as codex writes them: the turn's progress
        try:
            event = json.loads(line)
        except ValueError:
            continue
        item = event.get("item") or {}
        if event.get("type") == "item.completed" and item.get("type") == "agent_message":
            messages.append(item.get("text", ""))
            print(f"codex: {item.get('text', '')[:500]}", flush=True)
        elif event.get("type") == "turn.completed":
            usage = event.get("usage")
        elif event.get("type") in ("error", "turn.failed"):
            errors.append(json.dumps(event.get("error") or event.get("message") or event))
        elif event.get("type") == "item.completed" and item.get("type") == "command_execution":
            print(f"ran: {item.get('command')} (exit {item.get('exit_code')})", flush=True)
    returncode = codex.wait()
    stderr_file.seek(0)
    stderr = stderr_file.read()
    if returncode == 0 and usage is not None:
        return emit({"outcome": "done", "result": {"message": messages[-1] if messages else "",
                                                    "usage": usage}})  # fmt: skip
    error = "; ".join(errors) or stderr[-2000:] or f"codex exited {returncode}"
    if "429" in error or "rate limit" in error.lower() or "quota" in error.lower():
        return emit({"outcome": "quota_exhausted"})  # the gateway knows until when
    return emit({"outcome": "failed", "error": f"codex: {error}"[:3000]})


if __name__ == "__main__":
    sys.exit(main())
