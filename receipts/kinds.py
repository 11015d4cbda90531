"""Payload kinds, their contracts, agent ids with handlers, and routing to a Temporal task queue."""

from __future__ import annotations

import functools
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel

from receipts.errors import InvalidInput

MAX_ID_LENGTH = 200
NON_BLANK = r"\S"
# An objective id as its caller names it: never `.` or `..` (it names a workspace folder).
# Matched whole (`fullmatch`): `$` alone lets "x\n" through (a run job no route reaches).
OBJECTIVE_ID = re.compile(r"^(?!\.\.?$)[A-Za-z0-9._@-]{1,100}$")


@dataclass(frozen=True, slots=True)
class KindContract:
    """What a payload kind declares (docs/rules.md J18 says what reads each field):

    - `worker_group`: the group its contract names (routing may disagree, `route_disagrees`);
    - `workflow`: its durable workflow; a job of a kind with one is recorded in the ledger's
      `workflow_runs` under that name, the others are not (`deliveries.ledger_workflow`);
    - `has_durable_activity`: its attempts are recorded in the ledger's `activity_runs`;
    - `objective_scoped`: it belongs to the objective its payload names (the workspace is the
      objective's, the id is scoped by organization like a job id);
    - `objective_required`: it cannot run without one (`payload.objectiveId`, 422 without);
    - `reconciles_objective`: its terminal receipt or expired lease requests objective control;
    - `live_execution`: its output is watched live: objective control starts a task monitor
      beside each such job it dispatches, mirroring its start, output and settlement;
    - `terminal_objective_audit`: the objective it settles gets its audit requested.
    """

    kind: str
    worker_group: str
    workflow: str | None
    has_durable_activity: bool
    objective_scoped: bool
    objective_required: bool
    reconciles_objective: bool
    live_execution: bool
    terminal_objective_audit: bool


def _c(
    kind: str,
    group: str,
    workflow: str | None,
    durable: bool = False,
    scoped: bool = True,
    required: bool = True,
    reconcile: bool = False,
    live: bool = False,
    audit: bool = False,
) -> KindContract:
    return KindContract(kind, group, workflow, durable, scoped, required, reconcile, live, audit)


# docs/design.md §5: one table, one module. `factory.run` creates its objective (an id is
# assigned when the payload names none); `factory.task.run` also runs alone, in a workspace of
# its own; the watchdog scans every objective and names none.
CONTRACTS: Mapping[str, KindContract] = {
    c.kind: c
    for c in (
        _c("factory.dispatch", "control", "factory.dispatch"),
        _c("factory.run", "control", "factory.run", required=False, reconcile=True),
        _c(
            "factory.integration.publish", "codex", "factory.integration", reconcile=True, live=True
        ),
        _c(
            "factory.integration.validate",
            "codex",
            "factory.integration",
            reconcile=True,
            live=True,
        ),
        _c("factory.objective.audit", "control", None),
        _c("factory.objective.control", "control", "factory.objective", audit=True),
        _c("factory.objective.watchdog", "control", None, scoped=False, required=False),
        _c("factory.task.monitor", "control", None),
        _c(
            "factory.task.run",
            "codex",
            "factory.task",
            durable=True,
            required=False,
            reconcile=True,
            live=True,
        ),
    )
}
KINDS: tuple[str, ...] = tuple(CONTRACTS)

# Which steer / follow_up commands each kind's handler reads (the API documents it, and a
# command the job ends without reading is settled `queue.command.unconsumed` with the reason).
# Objective control reads both as coalesced control requests; a command runs steers on its
# stdin when its task asks for them (`steerable: true`); an agent turn hands steers to its
# command and carries follow-ups to the next turn. The other kinds read none.
TURN_KIND = "agent_job.turn"
COMMANDS_READ: Mapping[str, frozenset[str]] = {
    "factory.objective.control": frozenset({"steer", "follow_up"}),
    "factory.task.run": frozenset({"steer"}),
    "factory.integration.validate": frozenset({"steer"}),
    "factory.integration.publish": frozenset({"steer"}),
    TURN_KIND: frozenset({"steer", "follow_up"}),
}
STEERABLE_KINDS: frozenset[str] = frozenset(
    {"factory.task.run", "factory.integration.validate", "factory.integration.publish"}
)


def steerable_task(payload: Mapping[str, Any]) -> bool:
    """True when a command-running payload asks for steers on its command's stdin
    (`task.steerable` of a task posted directly, `input.steerable` of an objective's)."""
    for key in ("task", "input"):
        part = payload.get(key)
        if isinstance(part, Mapping) and part.get("steerable") is True:
            return True
    return False


def unread_because(
    agent_id: str, kind: str, payload: Mapping[str, Any], command: str
) -> str | None:
    """Why the handler of a job never reads a `command` (steer or follow_up), or None when it
    does (an abort it always honours)."""
    if command == "abort":
        return None
    if agent_id not in AGENT_IDS:
        if agent_id in installed_handlers():
            return None  # its handler reads them through `JobContext.commands()`
        return f"no handler runs agent '{agent_id}': nothing reads its commands"
    if command not in COMMANDS_READ.get(kind, frozenset()):
        return f"{kind} jobs do not read {command} commands"
    if kind in STEERABLE_KINDS and not steerable_task(payload):
        return "the task's command does not take steers (its task does not set steerable: true)"
    return None


def unconsumed_reason(agent_id: str, kind: str, payload: Mapping[str, Any], command: str) -> str:
    """Why a job ended with its `command` (steer or follow_up) unread."""
    return unread_because(agent_id, kind, payload, command) or (
        "the job ended before its handler read it"
    )


KINDS_WITHOUT_AUTH: frozenset[str] = frozenset({"factory.objective.watchdog"})

AGENT_IDS: tuple[str, ...] = ("factory", "factory-control", "factory-monitor", "codex")
QUEUE_DRIVER = "receipt-driver"
QUEUE_CHAT = "receipt-chat"
QUEUE_CODEX = "receipt-codex"
QUEUE_CONTROL = "receipt-control"
WORKER_QUEUES: tuple[str, ...] = (QUEUE_CHAT, QUEUE_CODEX, QUEUE_CONTROL)
GROUP_QUEUES: Mapping[str, str] = {
    "chat": QUEUE_CHAT,
    "codex": QUEUE_CODEX,
    "control": QUEUE_CONTROL,
}

# Handlers a team writes (`receipt_worker`) are installed as entry points named by their agent
# id: in this group to run where routing sends them, in `receipt.handlers.<group>` to run on
# that worker group.
HANDLERS_ENTRY_POINTS = "receipt.handlers"


def handlers_entry_points(group: str | None) -> str:
    """The entry-point group of the handlers that run on worker `group` (None: where routed)."""
    return HANDLERS_ENTRY_POINTS if group is None else f"{HANDLERS_ENTRY_POINTS}.{group}"


@functools.cache
def installed_handlers() -> Mapping[str, str | None]:
    """The agent ids of the handlers installed through entry points, each with the worker group
    it names (None: routing picks), read from the installed packages' metadata once per process
    (nothing is imported; the worker roles import them)."""
    found: dict[str, str | None] = {}
    for group in (None, *GROUP_QUEUES):
        for point in entry_points(group=handlers_entry_points(group)):
            found[point.name] = group if group is not None else found.get(point.name)
    return found


def installed_agent_ids() -> frozenset[str]:
    """The agent ids of the installed handlers."""
    return frozenset(installed_handlers())


def has_handler(agent_id: str) -> bool:
    """True when a handler runs `agent_id`: a built-in one or one installed (a worker whose
    installed handler fails to load is not ready, so its jobs wait for a worker that loaded it)."""
    return agent_id in AGENT_IDS or agent_id in installed_handlers()


AUTH_FIELDS_REQUIRED: tuple[str, ...] = ("userId", "organizationId")
AUTH_FIELDS_OPTIONAL: tuple[str, ...] = (
    "workspaceId",
    "receiptConnectGatewayUrl",
    "sessionId",
    "source",
)


def route(agent_id: str, kind: str) -> str:
    """Return the task queue a job is delivered on: agent id first, kind second (the spec's four
    lines), except for an installed handler that names its worker group (never a built-in id)."""
    named = installed_handlers().get(agent_id) if agent_id not in AGENT_IDS else None
    if named is not None:
        return GROUP_QUEUES[named]
    if agent_id == "codex":
        return QUEUE_CODEX
    if kind.startswith("factory.integration."):
        return QUEUE_CODEX
    if agent_id == "factory-control":
        return QUEUE_CONTROL
    return QUEUE_CHAT


def contract_queue(kind: str) -> str | None:
    """Return the task queue the kind's contract names (its worker group), or None if unknown."""
    contract = CONTRACTS.get(kind)
    return GROUP_QUEUES[contract.worker_group] if contract else None


def route_disagrees(agent_id: str, kind: str) -> bool:
    """True when routing and the kind's contract name different worker groups (docs/design.md §5)."""
    expected = contract_queue(kind)
    return expected is not None and expected != route(agent_id, kind)


class AuthContext(BaseModel):
    """Who the job acts for: `userId` and `organizationId` (non-blank), four optional strings.

    A strict schema: any other key is refused, so nothing unchecked rides along to
    the handlers. `receiptConnectGatewayUrl` is checked against the operator's allow-list by the
    API (`RECEIPT_GATEWAY_URL_ALLOWLIST`), not here: the domain does not know the deployment.
    """

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=False, extra="forbid", frozen=True
    )

    user_id: str = Field(pattern=NON_BLANK, max_length=MAX_ID_LENGTH)
    organization_id: str = Field(pattern=NON_BLANK, max_length=MAX_ID_LENGTH)
    workspace_id: str | None = Field(default=None, max_length=MAX_ID_LENGTH)
    receipt_connect_gateway_url: str | None = Field(default=None, max_length=2048)
    session_id: str | None = Field(default=None, max_length=MAX_ID_LENGTH)
    source: str | None = Field(default=None, max_length=MAX_ID_LENGTH)


def _known_kind(value: Any) -> str:
    if not isinstance(value, str) or value not in CONTRACTS:
        raise InvalidInput(
            "payload.kind",
            f"payload.kind must be one of the {len(KINDS)} payload kinds: {', '.join(KINDS)}",
            KINDS,
        )
    return value


KindName = Annotated[
    str,
    BeforeValidator(_known_kind),
    WithJsonSchema({"type": "string", "enum": list(KINDS)}),
]


class EnqueuePayload(BaseModel):
    """A job's input: its `kind` (one of nine), `authContext` (every kind but the watchdog), more.

    Fields other than these two are the handler's and pass through unchanged.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=False,
        extra="allow",
        json_schema_extra={
            "required": ["kind"],
            "if": {"properties": {"kind": {"not": {"enum": [*sorted(KINDS_WITHOUT_AUTH)]}}}},
            "then": {"required": ["authContext"]},
        },
    )

    kind: KindName = Field(default=None, validate_default=True)
    auth_context: AuthContext | None = Field(
        default=None, description="Required for every kind but factory.objective.watchdog"
    )

    @model_validator(mode="after")
    def _auth_required(self) -> EnqueuePayload:
        if self.auth_context is None and self.kind not in KINDS_WITHOUT_AUTH:
            raise InvalidInput(
                "payload.authContext",
                f"payload.authContext is required for kind '{self.kind}' and must carry "
                "userId and organizationId",
            )
        return self


def invalid_input(exc: ValidationError, prefix: str = "") -> InvalidInput:
    """Translate pydantic's first error into `InvalidInput` naming the field (dotted, `[i]`)."""
    first = exc.errors(include_url=False)[0]
    at = prefix
    for part in first.get("loc", ()):
        at = f"{at}[{part}]" if isinstance(part, int) else (f"{at}.{part}" if at else str(part))
    at = at or prefix or "body"
    kind = first.get("type")
    context = first.get("ctx") or {}
    if kind == "extra_forbidden":
        name = at.rsplit(".", 1)[-1]
        return InvalidInput(at, f"unknown field {name!r}", context.get("allowed"))
    if kind == "missing":
        return InvalidInput(at, f"{at} is required")
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return InvalidInput(at, f"{at} must be a JSON object")
    if kind == "one_of":
        return InvalidInput(at, f"{at} {first['msg']}", context.get("allowed"))
    return InvalidInput(at, f"{at}: {first['msg']}")


REDACTED = "[redacted]"


# Kinds that run no command themselves but make the tasks (and steps) that do: a
# `factory.run` plans an objective's tasks, a `factory.dispatch` adds a phase of them.
TASK_MAKING_KINDS = frozenset({"factory.run", "factory.dispatch"})


def runs_commands(agent_id: str, kind: str) -> bool:
    """True when a job of `agent_id` and `kind` runs commands (it is routed to the codex
    workers) or makes the tasks that do: enqueueing, steering or retrying it needs the API's
    `commands:run`."""
    return route(agent_id, kind) == QUEUE_CODEX or kind in TASK_MAKING_KINDS


def redact_payload(payload: Any) -> Any:
    """`payload` with the values of `task.env` replaced by `[redacted]`.

    What a caller passes to its command's environment may be a secret: reads, event streams and
    callbacks show the names only (the handler reads the stored payload).
    """
    if not isinstance(payload, Mapping):
        return payload
    task = payload.get("task")
    if not isinstance(task, Mapping) or not isinstance(task.get("env"), Mapping):
        return payload
    env = {name: REDACTED for name in task["env"]}
    return {**payload, "task": {**task, "env": env}}


def validate_payload(payload: Any) -> tuple[str, str | None]:
    """Check a payload's kind and authContext; return `(kind, organizationId)`.

    Raises `InvalidInput` naming the field and, for the kind, the nine accepted values.
    """
    if not isinstance(payload, Mapping):
        raise InvalidInput("payload", "payload must be a JSON object with a 'kind'")
    try:
        checked = EnqueuePayload.model_validate(payload)
    except ValidationError as exc:
        error = invalid_input(exc, "payload")
        if error.field.startswith("payload.authContext.") and error.allowed is None:
            if error.message.startswith("unknown field"):
                error.allowed = list(AUTH_FIELDS_REQUIRED + AUTH_FIELDS_OPTIONAL)
        raise error from None
    auth = checked.auth_context
    return checked.kind, auth.organization_id if auth is not None else None


def check_objective_id(value: Any, field: str = "objectiveId") -> str:
    """Return a valid objective id or raise `InvalidInput` naming `field`."""
    if not isinstance(value, str) or not OBJECTIVE_ID.fullmatch(value):
        raise InvalidInput(field, f"{field} must match {OBJECTIVE_ID.pattern}")
    return value


def scoped_payload(kind: str, payload: Mapping[str, Any], contract: KindContract) -> dict[str, Any]:
    """Enforce the contract's objective scoping on an enqueue payload.

    A kind that cannot run without an objective (`objective_required`) needs
    `payload.objectiveId`; a kind that may name one (`factory.task.run`) is checked when it does
    and otherwise runs alone, in a workspace of its own. `factory.run` creates the objective, so
    it may carry `payload.objective.objectiveId` instead, or none at all: then a new id is
    assigned here (and written into the payload) so that every later receipt can name it.
    """
    body = dict(payload)
    if not contract.objective_scoped:
        return body
    objective_id = body.get("objectiveId")
    if kind == "factory.run" and objective_id is None:
        inner = body.get("objective")
        inner_id = inner.get("objectiveId") if isinstance(inner, Mapping) else None
        objective_id = inner_id if inner_id is not None else str(uuid.uuid4())
        body["objectiveId"] = objective_id
    if objective_id is None:
        if not contract.objective_required:
            return body
        raise InvalidInput(
            "payload.objectiveId",
            f"payload.objectiveId is required for kind '{kind}' (it acts on an objective; "
            "kinds that run without one: "
            + ", ".join(k for k, c in CONTRACTS.items() if not c.objective_required)
            + ")",
        )
    check_objective_id(objective_id, "payload.objectiveId")
    if kind == "factory.run":
        inner = body.get("objective")
        if isinstance(inner, Mapping) and inner.get("objectiveId") not in (None, objective_id):
            raise InvalidInput(
                "payload.objective.objectiveId",
                "payload.objective.objectiveId must equal payload.objectiveId",
            )
    return body
