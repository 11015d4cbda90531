"""Payload kinds, their contracts, agent ids with handlers, and routing to a Temporal task queue."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from receipts.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class KindContract:
    """What a payload kind declares: its worker group, durable workflow and behaviour flags."""

    kind: str
    worker_group: str
    workflow: str | None
    has_durable_activity: bool
    objective_scoped: bool
    reconciles_objective: bool
    live_execution: bool
    terminal_objective_audit: bool


def _c(
    kind: str,
    group: str,
    workflow: str | None,
    durable: bool = False,
    scoped: bool = True,
    reconcile: bool = False,
    live: bool = False,
    audit: bool = False,
) -> KindContract:
    return KindContract(kind, group, workflow, durable, scoped, reconcile, live, audit)


# docs/design.md §5: one table, one module.
CONTRACTS: Mapping[str, KindContract] = {
    c.kind: c
    for c in (
        _c("factory.dispatch", "control", "factory.dispatch"),
        _c("factory.run", "control", "factory.run", reconcile=True),
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
        _c("factory.objective.watchdog", "control", None, scoped=False),
        _c("factory.task.monitor", "control", None, live=True),
        _c("factory.task.run", "codex", "factory.task", durable=True, reconcile=True, live=True),
    )
}
KINDS: tuple[str, ...] = tuple(CONTRACTS)
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

AUTH_FIELDS_REQUIRED: tuple[str, ...] = ("userId", "organizationId")
AUTH_FIELDS_OPTIONAL: tuple[str, ...] = (
    "workspaceId",
    "receiptConnectGatewayUrl",
    "sessionId",
    "source",
)


def route(agent_id: str, kind: str) -> str:
    """Return the task queue a job is delivered on: agent id first, kind second (the spec's four lines)."""
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


def validate_payload(payload: Any) -> tuple[str, str | None]:
    """Check a payload's kind and authContext; return `(kind, organizationId)`.

    Raises `InvalidInput` naming the field and, for the kind, the nine accepted values.
    """
    if not isinstance(payload, Mapping):
        raise InvalidInput("payload", "payload must be a JSON object with a 'kind'")
    kind = payload.get("kind")
    if not isinstance(kind, str) or kind not in CONTRACTS:
        raise InvalidInput(
            "payload.kind",
            f"payload.kind must be one of the {len(KINDS)} payload kinds: {', '.join(KINDS)}",
            KINDS,
        )
    auth = payload.get("authContext")
    if kind in KINDS_WITHOUT_AUTH and auth is None:
        return kind, None
    if not isinstance(auth, Mapping):
        raise InvalidInput(
            "payload.authContext",
            f"payload.authContext is required for kind '{kind}' and must carry "
            "userId and organizationId",
        )
    for name in AUTH_FIELDS_REQUIRED:
        value = auth.get(name)
        if not isinstance(value, str) or not value.strip():
            raise InvalidInput(
                f"payload.authContext.{name}",
                f"payload.authContext.{name} is required and must be a non-empty string",
            )
    for name in AUTH_FIELDS_OPTIONAL:
        value = auth.get(name)
        if value is not None and not isinstance(value, str):
            raise InvalidInput(
                f"payload.authContext.{name}", f"payload.authContext.{name} must be a string"
            )
    return kind, str(auth["organizationId"])
