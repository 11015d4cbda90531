"""Validation of agent-job requests: each error names the field and what is allowed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from receipts.agent_jobs.lifecycle import CreateRequest
from receipts.errors import InvalidInput
from receipts.text import check_clean_text

MAX_ID_LENGTH = 200
MAX_ROUTE_LENGTH = 1000
MAX_TEMPLATE_CHARS = 64 * 1024
MAX_PROMPT_CHARS = 256 * 1024
CREATE_FIELDS: tuple[str, ...] = (
    "agentId",
    "ownerSessionId",
    "sourceActorEventId",
    "sourceToolCallId",
    "replyRoute",
    "input",
    "workspaceTemplate",
    "continuedFromJobId",
    "providerBinding",
    "userId",
)
ROUTE_FIELDS: tuple[str, ...] = ("binding", "channel", "thread")
INPUT_FIELDS: tuple[str, ...] = ("prompt", "command")
ANSWER_FIELDS: tuple[str, ...] = ("answer", "toolCallId")


def _fields(value: Any, name: str, allowed: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidInput(name, f"{name} must be a JSON object")
    for key in value:
        if key not in allowed:
            field = f"{name}.{key}" if name != "body" else str(key)
            raise InvalidInput(field, f"unknown field {key!r}", allowed)
    return value


def _id(body: Mapping[str, Any], name: str, *, required: bool = True) -> str | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_ID_LENGTH:
        raise InvalidInput(
            name, f"{name} is required: a non-empty string of at most {MAX_ID_LENGTH} characters"
        )
    if "/" in value and name in ("ownerSessionId", "agentId"):
        raise InvalidInput(name, f"{name} must not contain '/' (it names a stream)")
    if "~" in value and name == "ownerSessionId":
        # The runtime scopes a session id by organization as `<id>~<tag>` (as job ids).
        raise InvalidInput(name, f"{name} must not contain '~'")
    return value


def parse_create(body: Any, organization_id: str) -> CreateRequest:
    """Validate a `POST /agent-jobs` body for the token's organization."""
    body = _fields(body, "body", CREATE_FIELDS)
    check_clean_text(body, "")
    route = _fields(body.get("replyRoute"), "replyRoute", ROUTE_FIELDS)
    for name in ("binding", "channel"):
        if not isinstance(route.get(name), str) or not route[name].strip():
            raise InvalidInput(
                f"replyRoute.{name}", f"replyRoute.{name} must be a non-empty string"
            )
    if route.get("thread") is not None and not isinstance(route["thread"], str):
        raise InvalidInput("replyRoute.thread", "replyRoute.thread must be a string")
    for name in ("binding", "channel", "thread"):
        # The route rides in every wakeup and every read of the job: a name, not a payload.
        if len(route.get(name) or "") > MAX_ROUTE_LENGTH:
            raise InvalidInput(
                f"replyRoute.{name}",
                f"replyRoute.{name} must be at most {MAX_ROUTE_LENGTH} characters",
            )
    given = _fields(body.get("input"), "input", INPUT_FIELDS)
    if len(given) != 1:
        raise InvalidInput(
            "input", "input must carry exactly one of: prompt, command", INPUT_FIELDS
        )
    if "prompt" in given:
        prompt = given["prompt"]
        if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_PROMPT_CHARS:
            raise InvalidInput(
                "input.prompt", f"input.prompt must be a non-empty string (≤ {MAX_PROMPT_CHARS})"
            )
    else:
        command = given["command"]
        if (
            not isinstance(command, list)
            or not command
            or not all(isinstance(part, str) for part in command)
        ):
            raise InvalidInput("input.command", "input.command must be a non-empty list of strings")
    template = body.get("workspaceTemplate")
    if template is not None and (
        not isinstance(template, str) or len(template) > MAX_TEMPLATE_CHARS
    ):
        raise InvalidInput(
            "workspaceTemplate",
            f"workspaceTemplate must be a string of at most {MAX_TEMPLATE_CHARS}",
        )
    return CreateRequest(
        agent_id=str(_id(body, "agentId")),
        organization_id=organization_id,
        owner_session_id=str(_id(body, "ownerSessionId")),
        source_actor_event_id=str(_id(body, "sourceActorEventId")),
        source_tool_call_id=str(_id(body, "sourceToolCallId")),
        reply_route={
            "binding": route["binding"],
            "channel": route["channel"],
            "thread": route.get("thread"),
        },
        input=dict(given),
        user_id=_id(body, "userId", required=False),
        workspace_template=template,
        continued_from_job_id=_id(body, "continuedFromJobId", required=False),
        provider_binding=_id(body, "providerBinding", required=False),
    )


def parse_answer(body: Any) -> tuple[Any, str | None]:
    """Validate a `POST /agent-jobs/{id}/input` body; return `(answer, toolCallId)`."""
    body = _fields(body, "body", ANSWER_FIELDS)
    check_clean_text(body, "")
    if "answer" not in body or body["answer"] is None:
        raise InvalidInput("answer", "answer is required (any JSON value but null)")
    return body["answer"], _id(body, "toolCallId", required=False)
