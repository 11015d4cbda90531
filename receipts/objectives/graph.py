"""Objective specs and task graphs: parse and validate (pure, no I/O).

A graph is refused, with nothing written, when a task id repeats, a dependency names no task,
or the dependencies form a cycle; the error names the ids at fault.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from receipts.errors import InvalidInput
from receipts.executables import oversized_argument
from receipts.kinds import OBJECTIVE_ID

# An objective id names a stream and a workspace directory: `.` and `..` are no names.
# Matched whole (`fullmatch`): `$` alone lets an id ending in a newline through.
TASK_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
EXECUTION_PATHS: tuple[str, ...] = ("local", "computer")
DEFAULT_TASK_AGENT = "codex"
DEFAULT_TASK_ATTEMPTS = 1
MAX_TASK_ATTEMPTS = 8
MAX_TASKS = 200
MAX_OBJECTIVE_TASKS = 1_000
"""Tasks an objective holds over all its phases: each of its receipts rewrites its whole state
(40 phases of 200 tasks made a 34.5 MB state, 1.3 s to write at every receipt)."""
MAX_TEXT = 20_000
TASK_FIELDS: tuple[str, ...] = (
    "taskId",
    "title",
    "agentId",
    "input",
    "dependsOn",
    "executionPath",
    "timeoutMs",
    "maxAttempts",
)
OBJECTIVE_FIELDS: tuple[str, ...] = (
    "objectiveId",
    "title",
    "goal",
    "tasks",
    "validate",
    "publish",
)


class GraphError(InvalidInput):
    """A task graph that cannot run: a duplicate id, an unknown dependency or a cycle."""


@dataclass(frozen=True, slots=True)
class StepSpec:
    """The validate or publish step: one command run in the objective's workspace."""

    command: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """The step as stored on the objective stream."""
        return {"command": list(self.command)}


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One task of the graph: a command (argv) or a prompt, run after its dependencies."""

    task_id: str
    title: str
    agent_id: str
    command: tuple[str, ...] | None
    prompt: str | None
    depends_on: tuple[str, ...]
    execution_path: str
    timeout_ms: int | None
    max_attempts: int

    def to_json(self) -> dict[str, Any]:
        """The task as stored on the objective stream (camelCase, the input shape)."""
        task_input: dict[str, Any] = (
            {"command": list(self.command)} if self.command is not None else {"prompt": self.prompt}
        )
        return {
            "taskId": self.task_id,
            "title": self.title,
            "agentId": self.agent_id,
            "input": task_input,
            "dependsOn": list(self.depends_on),
            "executionPath": self.execution_path,
            "timeoutMs": self.timeout_ms,
            "maxAttempts": self.max_attempts,
        }


@dataclass(frozen=True, slots=True)
class ObjectiveSpec:
    """A written goal and (unless a planner supplies them) its tasks, validate and publish."""

    objective_id: str | None
    title: str
    goal: str
    tasks: tuple[TaskSpec, ...] | None
    validate: StepSpec | None
    publish: StepSpec | None


def _text(value: Any, field: str, *, required: bool = True) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise InvalidInput(field, f"{field} must be a non-empty string")
    if len(value) > MAX_TEXT:
        raise InvalidInput(field, f"{field} must be at most {MAX_TEXT} characters")
    return value


def _argv(value: Any, field: str) -> tuple[str, ...]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(part, str) and part for part in value)
    ):
        raise InvalidInput(field, f"{field} must be a non-empty list of non-empty strings (argv)")
    oversized = oversized_argument([(field, value)])
    if oversized is not None:
        raise InvalidInput(*oversized)
    return tuple(value)


def _step(value: Any, field: str) -> StepSpec | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) - {"command"}:
        raise InvalidInput(field, f"{field} must be an object {{command: [argv]}}")
    return StepSpec(_argv(value.get("command"), f"{field}.command"))


def _object(raw: Any, field: str, noun: str, fields: tuple[str, ...], shape: str = "") -> None:
    """Refuse (`InvalidInput`) what is not an object, or an object with a field not in `fields`
    (the error names the first such field and lists the `noun`'s fields)."""
    if not isinstance(raw, Mapping):
        raise InvalidInput(field or "body", f"{field or 'the body'} must be an object{shape}")
    unknown = [name for name in raw if name not in fields]
    if unknown:
        named = under(field, unknown[0])
        raise InvalidInput(named, f"unknown {noun} field {unknown[0]!r}", fields)


def parse_task(raw: Any, field: str) -> TaskSpec:
    """Parse one task object; raise `InvalidInput` naming the field at fault."""
    _object(raw, field, "task", TASK_FIELDS)
    task_id = raw.get("taskId")
    if not isinstance(task_id, str) or not TASK_ID.fullmatch(task_id):
        raise InvalidInput(
            f"{field}.taskId", f"{field}.taskId must match {TASK_ID.pattern} (got {task_id!r})"
        )
    agent_id = raw.get("agentId", DEFAULT_TASK_AGENT) or DEFAULT_TASK_AGENT
    if agent_id != DEFAULT_TASK_AGENT:
        raise InvalidInput(
            f"{field}.agentId",
            f"{field}.agentId must be {DEFAULT_TASK_AGENT!r} (the agent that runs tasks)",
            (DEFAULT_TASK_AGENT,),
        )
    task_input = raw.get("input")
    if not isinstance(task_input, Mapping) or len(task_input) != 1:
        raise InvalidInput(
            f"{field}.input",
            f"{field}.input must be exactly one of {{command: [argv]}} or {{prompt}}",
        )
    command: tuple[str, ...] | None = None
    prompt: str | None = None
    if "command" in task_input:
        command = _argv(task_input["command"], f"{field}.input.command")
    elif "prompt" in task_input:
        prompt = _text(task_input["prompt"], f"{field}.input.prompt")
    else:
        raise InvalidInput(
            f"{field}.input",
            f"{field}.input must be exactly one of {{command: [argv]}} or {{prompt}}",
        )
    depends = raw.get("dependsOn")
    depends = [] if depends is None else depends  # `false` or `""` is no list, not "none"
    if not isinstance(depends, list) or not all(isinstance(d, str) for d in depends):
        raise InvalidInput(f"{field}.dependsOn", f"{field}.dependsOn must be a list of task ids")
    path = raw.get("executionPath", "local") or "local"
    if path not in EXECUTION_PATHS:
        raise InvalidInput(
            f"{field}.executionPath",
            f"{field}.executionPath must be one of: {', '.join(EXECUTION_PATHS)}",
            EXECUTION_PATHS,
        )
    timeout = raw.get("timeoutMs")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0
    ):
        raise InvalidInput(f"{field}.timeoutMs", f"{field}.timeoutMs must be a positive integer")
    attempts = raw.get("maxAttempts", DEFAULT_TASK_ATTEMPTS)
    if (
        isinstance(attempts, bool)
        or not isinstance(attempts, int)
        or not 1 <= attempts <= MAX_TASK_ATTEMPTS
    ):
        raise InvalidInput(
            f"{field}.maxAttempts",
            f"{field}.maxAttempts must be an integer in 1..{MAX_TASK_ATTEMPTS}",
        )
    return TaskSpec(
        task_id=task_id,
        title=_text(raw.get("title") or task_id, f"{field}.title"),
        agent_id=agent_id,
        command=command,
        prompt=prompt,
        depends_on=tuple(dict.fromkeys(depends)),
        execution_path=path,
        timeout_ms=timeout,
        max_attempts=attempts,
    )


def parse_tasks(
    raw: Any, field: str = "tasks", taken: Mapping[str, int] | None = None
) -> tuple[TaskSpec, ...]:
    """Parse and validate a task list as one graph.

    `taken` maps task ids already used by earlier phases to their phase: reusing one is refused.
    Raises `GraphError` for an empty list, a duplicate id, an unknown dependency or a cycle.
    """
    if not isinstance(raw, list):
        raise InvalidInput(field, f"{field} must be a list of tasks")
    if not raw:
        raise GraphError(field, f"{field} is empty: a graph needs at least one task")
    if len(raw) > MAX_TASKS:
        raise InvalidInput(field, f"{field} may hold at most {MAX_TASKS} tasks")
    if len(taken or {}) + len(raw) > MAX_OBJECTIVE_TASKS:
        raise InvalidInput(
            field,
            f"an objective holds at most {MAX_OBJECTIVE_TASKS} tasks over all its phases; it has "
            f"{len(taken or {})} and {field} adds {len(raw)}",
        )
    tasks = tuple(parse_task(item, f"{field}[{i}]") for i, item in enumerate(raw))
    validate_graph(tasks, field, taken or {})
    return tasks


def validate_graph(tasks: Sequence[TaskSpec], field: str, taken: Mapping[str, int]) -> None:
    """Refuse duplicate ids, unknown dependencies and cycles, naming the ids at fault."""
    ids: dict[str, int] = {}
    for i, task in enumerate(tasks):
        if task.task_id in ids:
            raise GraphError(
                f"{field}[{i}].taskId", f"duplicate task id {task.task_id!r} in {field}"
            )
        if task.task_id in taken:
            raise GraphError(
                f"{field}[{i}].taskId",
                f"task id {task.task_id!r} is already used by phase {taken[task.task_id]}",
            )
        ids[task.task_id] = i
    for i, task in enumerate(tasks):
        for dep in task.depends_on:
            if dep not in ids:
                raise GraphError(
                    f"{field}[{i}].dependsOn",
                    f"task {task.task_id!r} depends on unknown task {dep!r}",
                )
    cycle = find_cycle({t.task_id: t.depends_on for t in tasks})
    if cycle:
        raise GraphError(field, f"dependency cycle: {' -> '.join(cycle)}")


def find_cycle(edges: Mapping[str, Sequence[str]]) -> list[str] | None:
    """Return one dependency cycle as task ids (first id repeated at the end), or None."""
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(edges, white)
    for start in sorted(edges):
        if colour[start] != white:
            continue
        path: list[str] = [start]
        iterators = [iter(edges[start])]
        colour[start] = grey
        while iterators:
            advanced = False
            for dep in iterators[-1]:
                if colour.get(dep, black) == grey:
                    return [*path[path.index(dep) :], dep]
                if colour.get(dep) == white:
                    colour[dep] = grey
                    path.append(dep)
                    iterators.append(iter(edges[dep]))
                    advanced = True
                    break
            if not advanced:
                colour[path.pop()] = black
                iterators.pop()
    return None


def parse_objective(raw: Any, field: str = "objective") -> ObjectiveSpec:
    """Parse an objective: `{objectiveId?, title, goal, tasks?, validate?, publish?}`.

    `tasks` may be absent (a planner supplies them); when present it must be a valid graph.
    Errors name its fields under `field` (`""`: the objective is the request's body).
    """
    _object(raw, field, "objective", OBJECTIVE_FIELDS, " {title, goal, tasks?, ...}")
    objective_id = raw.get("objectiveId")
    if objective_id is not None and (
        not isinstance(objective_id, str) or not OBJECTIVE_ID.fullmatch(objective_id)
    ):
        named = under(field, "objectiveId")
        raise InvalidInput(named, f"{named} must match {OBJECTIVE_ID.pattern}")
    tasks_raw = raw.get("tasks")
    return ObjectiveSpec(
        objective_id=objective_id,
        title=_text(raw.get("title"), under(field, "title")),
        goal=_text(raw.get("goal"), under(field, "goal")),
        tasks=None if tasks_raw is None else parse_tasks(tasks_raw, under(field, "tasks")),
        validate=_step(raw.get("validate"), under(field, "validate")),
        publish=_step(raw.get("publish"), under(field, "publish")),
    )


def under(field: str, name: str) -> str:
    """The name of `field`'s member `name` in an error (`name` alone when `field` is the body)."""
    return f"{field}.{name}" if field else name
