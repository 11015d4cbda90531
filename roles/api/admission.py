"""Admission of an enqueue beyond its body's validity: who may run commands, the
operator's caps on `timeoutMs` and on each organization's queued and active jobs, and the
allow-list of gateway URLs. Each refusal answers the one error shape, is logged and counted."""

from __future__ import annotations

import dataclasses
import logging

from receipts import metrics
from receipts.enqueue import Admission, EnqueueRequest
from receipts.errors import InvalidInput
from receipts.kinds import QUEUE_CODEX, route
from roles.api.auth import COMMANDS_RUN, Principal
from roles.api.deps import ApiError, require_scope, too_many
from roles.api.errors import RETRY_AFTER_S
from roles.api.limits import refusals
from roles.api.settings import ApiSettings

log = logging.getLogger("roles.api.app")


def runs_commands(agent_id: str, kind: str) -> bool:
    """True when a job of `agent_id` and `kind` runs commands (it is routed to the codex workers):
    enqueueing, steering or retrying it needs `commands:run`."""
    return route(agent_id, kind) == QUEUE_CODEX


def check_command_rights(
    caller: Principal, settings: ApiSettings, agent_id: str, request: EnqueueRequest
) -> None:
    """A kind routed to the codex workers runs a command: `commands:run`, and when the
    organization has an allow-list (`RECEIPT_ORG_EXECUTABLES`), an executable on it."""
    if not runs_commands(agent_id, request.kind):
        return
    require_scope(caller, COMMANDS_RUN)
    allowed = settings.org_executables.get(request.organization_id or "")
    if allowed is None:
        return
    task = request.payload.get("task")
    command = task.get("command") if isinstance(task, dict) else None
    program = command[0] if isinstance(command, list) and command else None
    if not isinstance(program, str) or program not in allowed:
        raise ApiError(
            403,
            "forbidden",
            f"payload.task.command[0] must be one of this organization's executables: "
            f"{', '.join(allowed)}",
            field="payload.task.command",
            allowed=allowed,
        )


def capped_timeout(settings: ApiSettings, request: EnqueueRequest) -> EnqueueRequest:
    """The request with `payload.timeoutMs` clamped to the operator's cap
    (`RECEIPT_MAX_TIMEOUT_MS`): a job cannot ask to hold a worker slot for longer."""
    timeout = request.payload.get("timeoutMs")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        return request
    if timeout <= settings.max_timeout_ms:
        return request
    payload = {**request.payload, "timeoutMs": settings.max_timeout_ms}
    return dataclasses.replace(request, payload=payload)


def _under(url: str, prefix: str) -> bool:
    """True when `url` is `prefix` or below it: `https://gw.example` admits
    `https://gw.example/v1`, not `https://gw.example.evil.net`."""
    return url == prefix or (
        url.startswith(prefix) and (prefix.endswith("/") or url[len(prefix)] in "/?#")
    )


def check_gateway(settings: ApiSettings, request: EnqueueRequest) -> None:
    """`receiptConnectGatewayUrl` must start with a prefix on `RECEIPT_GATEWAY_URL_ALLOWLIST`."""
    auth = request.payload.get("authContext")
    gateway = auth.get("receiptConnectGatewayUrl") if isinstance(auth, dict) else None
    if gateway is not None and not any(
        _under(gateway, prefix) for prefix in settings.gateway_url_allowlist
    ):
        raise InvalidInput(
            "payload.authContext.receiptConnectGatewayUrl",
            "payload.authContext.receiptConnectGatewayUrl is not on the operator's allow-list "
            "(RECEIPT_GATEWAY_URL_ALLOWLIST)",
            settings.gateway_url_allowlist,
        )


def org_caps(settings: ApiSettings, organization_id: str) -> Admission:
    """The enqueue's admission: 429 when the organization holds its cap of queued or of active
    jobs (its counters, kept with every status change: one read of at most 16 rows, however
    deep its queue), checked on the enqueue's first read and again by its write."""

    def refuse(queued: int, active: int) -> None:
        for cap, held, limit, variable in (
            ("queued", queued, settings.org_max_queued, "RECEIPT_ORG_MAX_QUEUED"),
            ("active", active, settings.org_max_active, "RECEIPT_ORG_MAX_ACTIVE"),
        ):
            if held >= limit:
                metrics.API_LIMITED.labels(cap).inc()
                if (unlogged := refusals.due(cap, organization_id)) is not None:
                    log.warning(
                        "organization at its %s-jobs cap",
                        cap,
                        extra={
                            "event": "api.org_cap",
                            "cap": cap,
                            "organizationId": organization_id,
                            "unloggedSince": unlogged,
                        },
                    )
                raise too_many(
                    f"the organization has {held} {cap} jobs ({variable})", RETRY_AFTER_S
                )

    return Admission(organization_id, settings.org_max_queued, settings.org_max_active, refuse)
