"""Admission of an enqueue beyond its body's validity: who may run commands, the
operator's caps on `timeoutMs` and on each organization's queued and active jobs, and the
allow-list of gateway URLs. Each refusal answers the one error shape, is logged and counted."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from receipts import metrics
from receipts.enqueue import Admission, EnqueueRequest
from receipts.enqueue_request import GATEWAY_FIELD, cap_timeout, gateway_refused
from receipts.errors import InvalidInput, NotPermitted
from receipts.executables import first_refused, refused_request, request_commands
from receipts.kinds import AGENT_IDS, has_handler, installed_agent_ids, runs_commands
from roles.api.auth import COMMANDS_RUN, Principal
from roles.api.deps import ApiError, require_scope, too_many
from roles.api.errors import RETRY_AFTER_S
from roles.api.limits import refusals
from roles.api.settings import ApiSettings

log = logging.getLogger("roles.api.app")


def check_agent(settings: ApiSettings, agent_id: str) -> None:
    """With `RECEIPT_STRICT_AGENT_IDS=1`, 404 `unknown_agent` naming the known agent ids for one
    without a handler: a post of its job, or a schedule of it."""
    if settings.strict_agent_ids and not has_handler(agent_id):
        known = (*AGENT_IDS, *sorted(installed_agent_ids()))
        raise ApiError(
            404,
            "unknown_agent",
            f"no handler for agent {agent_id!r}; agent ids: {', '.join(known)}",
            field="agentId",
            allowed=known,
        )


def check_command_rights(
    caller: Principal, settings: ApiSettings, agent_id: str, request: EnqueueRequest
) -> None:
    """A kind that runs commands, or makes the tasks that do, needs `commands:run`, and when the
    organization has an allow-list (`RECEIPT_ORG_EXECUTABLES`), every command an executable on
    it (a codex job without one is refused)."""
    if not runs_commands(agent_id, request.kind):
        return
    require_scope(caller, COMMANDS_RUN)
    check_executables(settings, request.organization_id, request_commands(request))


def check_executables(
    settings: ApiSettings, organization_id: str | None, commands: list[tuple[str, Any]]
) -> None:
    """403 naming the field unless each command's program is on the organization's allow-list
    (none: anything)."""
    allowed = settings.org_executables.get(organization_id or "")
    refused = first_refused(allowed, commands)
    if refused is not None:
        field, message = refused
        raise ApiError(403, "forbidden", message, field=field, allowed=allowed)


def held_retry(settings: ApiSettings) -> Callable[[EnqueueRequest], EnqueueRequest]:
    """What a retry is held to (receipts/retry.py `Held`): a retry runs the old job's commands
    again, so, as a schedule's firing, it is held to the allow-list of executables, the gateway
    URLs' and the `timeoutMs` cap as they are now, not as they were when the job was posted
    (403 naming the field)."""

    def held(request: EnqueueRequest) -> EnqueueRequest:
        allow_lists = settings.org_executables
        refused = refused_request(allow_lists, request.agent_id, request)
        if refused is not None:
            field, message = refused
            allowed = allow_lists.get(request.organization_id or "")
            raise NotPermitted(field, message, allowed)
        unlisted = gateway_refused(request, settings.gateway_url_allowlist)
        if unlisted is not None:
            raise NotPermitted(GATEWAY_FIELD, unlisted, settings.gateway_url_allowlist)
        return cap_timeout(request, settings.max_timeout_ms)

    return held


def check_gateway(settings: ApiSettings, request: EnqueueRequest) -> None:
    """`receiptConnectGatewayUrl` must start with a prefix on `RECEIPT_GATEWAY_URL_ALLOWLIST`."""
    refused = gateway_refused(request, settings.gateway_url_allowlist)
    if refused is not None:
        raise InvalidInput(GATEWAY_FIELD, refused, settings.gateway_url_allowlist)


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


def caller_caps(settings: ApiSettings, caller: Principal) -> Admission | None:
    """The caps a caller's new jobs count against: its organization's (an admin's work, across
    organizations, is the operator's own: none)."""
    if caller.admin or caller.organization_id is None:
        return None
    return org_caps(settings, caller.organization_id)
