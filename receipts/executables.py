"""Each organization's allow-list of executables (`RECEIPT_ORG_EXECUTABLES`): which commands a
request or a planner's graph names, and whether each program is on the list. The api checks a
request's commands; the Factory's worker checks the tasks a planner writes. And whether each
argument of a command could be given to it at all (`MAX_ARG_BYTES`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from receipts.kinds import installed_handlers, runs_commands


class Enqueue(Protocol):
    """What these checks read of an enqueue (`receipts.enqueue_request.EnqueueRequest`, which
    checks its own arguments here: named by shape, not imported)."""

    @property
    def agent_id(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def organization_id(self) -> str | None: ...
    @property
    def payload(self) -> dict[str, Any]: ...


SETTING = "RECEIPT_ORG_EXECUTABLES"
MAX_ARG_BYTES = 32 * 4096 - 1
"""The longest argument, and environment entry (`NAME=value`), a command can be started with, in
UTF-8 bytes: Linux's MAX_ARG_STRLEN (32 pages, its NUL included). A longer one fails the start
(`Argument list too long`) after the job was accepted, so a request naming one is refused."""


def parse_allow_lists(value: Any) -> Any:
    """`{"org-a": ["git", "pytest"]}`: JSON in the variable, or a path to a JSON file. Errors
    are ValueErrors, so that the settings' message names the variable."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text and not text.startswith("{"):
        try:
            text = Path(text).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"a readable JSON file ({exc.strerror})") from None
    try:
        return json.loads(text) if text else {}
    except json.JSONDecodeError as exc:
        raise ValueError(
            f'a JSON object {{"<organization>": ["<executable>", ...]}} ({exc})'
        ) from None


def objective_commands(objective: Any, field: str) -> list[tuple[str, Any]]:
    """`(field, argv)` of every command an objective's body names: its tasks' `input.command`,
    `validate.command` and `publish.command` (a prompt task runs the operator's codex command)."""
    if not isinstance(objective, dict):
        return []
    prefix = f"{field}." if field else ""  # "": the objective is the request's body
    return [
        *task_commands(objective.get("tasks"), f"{prefix}tasks"),
        *(
            (f"{prefix}{step}.command", objective[step].get("command"))
            for step in ("validate", "publish")
            if isinstance(objective.get(step), dict)
        ),
    ]


def task_commands(tasks: Any, field: str) -> list[tuple[str, Any]]:
    """`(field, argv)` of the tasks of a list that name a command."""
    if not isinstance(tasks, list):
        return []
    return [
        (f"{field}[{n}].input.command", task["input"].get("command"))
        for n, task in enumerate(tasks)
        if isinstance(task, dict)
        and isinstance(task.get("input"), dict)
        and "command" in task["input"]
    ]


def first_refused(
    allowed: list[str] | None, commands: list[tuple[str, Any]]
) -> tuple[str, str] | None:
    """`(field, message)` of the first command whose program is not on `allowed` (None: no
    list, anything runs), or None when every one is."""
    if allowed is None:
        return None
    for field, command in commands:
        program = command[0] if isinstance(command, list) and command else None
        if not isinstance(program, str) or program not in allowed:
            return field, (
                f"{field}[0] must be one of this organization's executables: {', '.join(allowed)}"
            )
    return None


def oversized_argument(commands: list[tuple[str, Any]]) -> tuple[str, str] | None:
    """`(field, message)` of the first argument of `commands` longer than `MAX_ARG_BYTES`."""
    for field, command in commands:
        for n, part in enumerate(command if isinstance(command, list) else ()):
            if isinstance(part, str) and _utf8_len(part) > MAX_ARG_BYTES:
                return f"{field}[{n}]", (
                    f"{field}[{n}] is {_utf8_len(part)} bytes; a command's argument may be at "
                    f"most {MAX_ARG_BYTES} (Linux's MAX_ARG_STRLEN): give long text on its stdin"
                )
    return None


def oversized_request(request: Enqueue) -> tuple[str, str] | None:
    """`(field, message)` when a command `request` runs could not be started: an argument, or
    an entry of `payload.task.env` (`NAME=value`), longer than `MAX_ARG_BYTES`."""
    if not runs_commands(request.agent_id, request.kind):
        return None
    refused = oversized_argument(request_commands(request))
    if refused is not None:
        return refused
    task = request.payload.get("task")
    env = task.get("env") if isinstance(task, dict) else None
    for name, value in env.items() if isinstance(env, dict) else ():
        size = _utf8_len(f"{name}={value}") if isinstance(value, str) else 0
        if size > MAX_ARG_BYTES:
            return f"payload.task.env.{name}", (
                f"payload.task.env.{name} is {size} bytes as NAME=value; an environment entry "
                f"may be at most {MAX_ARG_BYTES} (Linux's MAX_ARG_STRLEN)"
            )
    return None


def _utf8_len(text: str) -> int:
    """`text`'s length in UTF-8 bytes, as the command is given it."""
    return len(text.encode("utf-8", "surrogatepass"))


def request_commands(request: Enqueue) -> list[tuple[str, Any]]:
    """`(field, argv)` of every command an enqueue names: an objective's (`factory.run`), a
    dispatch's tasks, else what the codex handlers run (activities/handlers/factory.py):
    `input.command` when the payload has an `input` (a prompt runs the operator's
    RECEIPT_CODEX_COMMAND), else `task.command`. A payload that names neither is refused under
    an allow-list. An installed handler names none here: it chooses its own argv, held to the
    list when it runs it (`JobContext.run_sandboxed`), from whatever field it reads."""
    if request.agent_id in installed_handlers():
        return []
    payload = request.payload
    if request.kind == "factory.run":
        return objective_commands(payload.get("objective"), "payload.objective")
    if request.kind == "factory.dispatch":
        return task_commands(payload.get("tasks"), "payload.tasks")
    given = payload.get("input")
    if isinstance(given, dict) and "prompt" in given and "command" not in given:
        return []
    if given is not None:
        command = given.get("command") if isinstance(given, dict) else None
        return [("payload.input.command", command)]
    task = payload.get("task")
    return [("payload.task.command", task.get("command") if isinstance(task, dict) else None)]


def refused_request(
    allow_lists: Mapping[str, list[str]], agent_id: str, request: Enqueue
) -> tuple[str, str] | None:
    """`(field, message)` when `request` runs a command whose program is off its organization's
    allow-list; None when it runs none, the organization has no list, or every one is on it."""
    if not runs_commands(agent_id, request.kind):
        return None
    return first_refused(allow_lists.get(request.organization_id or ""), request_commands(request))
