"""The turn protocol (pure): the request line a turn reads on stdin, the outcome it prints as the
last JSON line of stdout, and the AGENTS.md a workspace starts with."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from importlib import resources
from typing import Any

from receipts.agent_jobs.model import AgentJob
from receipts.agent_jobs.registry import AgentDefinition
from receipts.streams import json_bytes

OUTCOMES: tuple[str, ...] = ("done", "needs_input", "failed", "quota_exhausted")
# A turn's result names the follow-ups its handler read (their command ids on its queue job),
# never their payloads: the settlement reads those from their receipts (lifecycle.py). A result
# of an earlier worker holds them whole, under `followUps`.
FOLLOW_UPS_READ = "followUpsRead"
MAX_ERROR_CHARS = 4_000
# A `done` result or a `needs_input` question, in UTF-8 bytes of JSON: a plug-in handler's result
# bound (activities/handlers/sdk.py). The outcome line is cut at 1 Mi characters, up to 4 MiB of
# UTF-8, and what it carries is copied into the turn's result, the agent job's state and
# receipts, its wakeup and its webhooks.
MAX_OUTCOME_BYTES = 1024 * 1024


def turn_request(
    job: AgentJob, agent: AgentDefinition, *, attempt: int, turn: int, workspace: str
) -> dict[str, Any]:
    """The first stdin line of a turn: the prompt (or command), the answer or follow-ups it
    continues with, and the job context."""
    request: dict[str, Any] = {
        "type": "turn",
        "agentJobId": job.agent_job_id,
        "attempt": attempt,
        "turn": turn,
        "prompt": job.input.get("prompt"),
        "context": {
            "agentId": job.agent_id,
            "soul": agent.soul,
            "mission": agent.mission,
            "plugins": agent.plugins,
            "skills": agent.skills,
            "providerBinding": job.provider_binding or agent.provider_binding,
            "ownerSessionId": job.owner_session_id,
            "replyRoute": job.reply_route.model_dump(mode="json", by_alias=True),
            "workspace": workspace,
            "continuedFromJobId": job.continued_from_job_id,
        },
    }
    if "command" in job.input:
        request["command"] = job.input["command"]
    if job.answer is not None:
        request["answer"] = job.answer
    if job.follow_up:
        request["followUps"] = job.follow_up
    return request


def _failed(error: str, retryable: bool = True) -> dict[str, Any]:
    return {"outcome": "failed", "error": error[:MAX_ERROR_CHARS], "retryable": retryable}


def _valid(candidate: Mapping[str, Any]) -> dict[str, Any]:
    kind = candidate.get("outcome")
    if kind == "done":
        return _bounded("result", {"outcome": "done", "result": candidate.get("result")})
    if kind == "needs_input":
        question, call_id = candidate.get("question"), candidate.get("toolCallId")
        if not isinstance(question, str) or not isinstance(call_id, str) or not call_id:
            return _failed("needs_input needs a string question and a non-empty toolCallId")
        asked = {"outcome": "needs_input", "question": question, "toolCallId": call_id}
        return _bounded("question", asked)
    if kind == "failed":
        out = _failed(str(candidate.get("error") or "the agent reported failure"))
        out["retryable"] = candidate.get("retryable", True) is not False
        delay = candidate.get("retryDelayMs")
        if isinstance(delay, int) and not isinstance(delay, bool) and delay >= 0:
            out["retryDelayMs"] = delay
        return out
    if kind == "quota_exhausted":
        out = {"outcome": "quota_exhausted"}
        retry_at = candidate.get("retryAt")
        if isinstance(retry_at, str):
            try:
                parsed = datetime.fromisoformat(retry_at)
            except ValueError:
                parsed = None
            if parsed is not None and parsed.tzinfo is not None:
                out["retryAt"] = parsed.isoformat()
        return out
    return _failed(f"unknown outcome {kind!r}; expected one of {', '.join(OUTCOMES)}")


def _bounded(field: str, outcome: dict[str, Any]) -> dict[str, Any]:
    """`outcome`, or a failed turn (not retried: the command would say it again) when its
    `field` is over MAX_OUTCOME_BYTES of JSON."""
    size = json_bytes(outcome[field])
    if size <= MAX_OUTCOME_BYTES:
        return outcome
    return _failed(
        f"the turn's {field} is {size} bytes of JSON; at most {MAX_OUTCOME_BYTES} are kept",
        retryable=False,
    )


def parse_outcome(lines: Iterable[str], exit_code: int | None) -> dict[str, Any]:
    """The turn's outcome: the last stdout line that is a JSON object with `outcome`.

    Without one, the turn failed (retryable): a crash, a non-zero exit, or garbage.
    """
    last: Mapping[str, Any] | None = None
    for line in lines:
        text = line.strip()
        if not text.startswith("{"):
            continue
        try:
            value = json.loads(text)
        except ValueError:
            continue
        if isinstance(value, Mapping) and "outcome" in value:
            last = value
    if last is None:
        return _failed(f"the turn exited with status {exit_code} without an outcome line")
    return _valid(last)


def job_guidance() -> str:
    """The deployment-wide Job Guidance template shipped with the project."""
    return resources.files(__package__).joinpath("AGENT_JOB.md").read_text(encoding="utf-8")


def compose_agents_md(job: AgentJob, agent: AgentDefinition, workspace: str) -> str:
    """AGENTS.md of a new workspace: the workspace template, the rendered job context (soul,
    mission, durable context, execution facts), then the Job Guidance section."""
    parts: list[str] = []
    if job.workspace_template:
        parts.append(job.workspace_template.rstrip() + "\n")
    facts = [
        f"- Agent job: {job.agent_job_id}",
        f"- Agent: {job.agent_id}",
        f"- Owner session: {job.owner_session_id}",
        f"- Reply route: {job.reply_route.binding} / {job.reply_route.channel}"
        + (f" / {job.reply_route.thread}" if job.reply_route.thread else ""),
        f"- Provider binding: {job.provider_binding or agent.provider_binding or 'none'}",
        f"- Plugins: {', '.join(agent.plugins) or 'none'}",
        f"- Skills: {', '.join(agent.skills) or 'none'}",
        f"- Workspace: {workspace}",
        f"- Continued from: {job.continued_from_job_id or 'none'}",
    ]
    parts.append(
        "# Job context\n\n"
        f"## Soul\n\n{agent.soul.strip() or '(none)'}\n\n"
        f"## Mission\n\n{agent.mission.strip() or '(none)'}\n\n"
        f"## Durable context\n\n{agent.durable_context.strip() or '(none)'}\n\n"
        "## Execution facts\n\n" + "\n".join(facts) + "\n"
    )
    parts.append("## Job Guidance\n\n" + job_guidance().strip() + "\n")
    return "\n".join(parts)
