"""Job timing derivations: lease, execution timeout, heartbeat cadence and driver timeout.

Everything here is pure: a process reads its variables once (``receipts.settings``). It implements the
spec section "Leases, timeouts and heartbeats" (``receipt-jobs-lanes-and-durable-execution.md``)
and docs/design.md; every configuration variable keeps its spec name and default.

Lease (``lease_ms``):

- default: ``JOB_LEASE_MS`` (300 000);
- ``factory-control`` running ``factory.objective.control``:
  max(default, ``FACTORY_CONTROL_JOB_LEASE_MS`` (900 000));
- ``factory-monitor`` running ``factory.task.monitor`` with ``executionPath == "computer"``:
  max(default, ``CODEX_JOB_LEASE_MS`` (900 000));
- ``codex``: max(``CODEX_JOB_LEASE_MS``, min(``timeoutMs`` + 300 000, 3 600 000)), or
  ``CODEX_JOB_LEASE_MS`` when the payload has no ``timeoutMs``.

The job kind and execution path are read from the payload's top-level ``kind`` and
``executionPath``; the codex payload timeout is the top-level ``timeoutMs``. A ``timeoutMs`` that
is not a finite, positive ``int``/``float`` (``bool`` excluded) counts as absent; a fractional one
is rounded up to whole milliseconds. The 3 600 000 cap bounds the payload-derived term only, so
a ``CODEX_JOB_LEASE_MS`` configured above the cap is still honoured as the codex lease.

Execution timeout (``execution_timeout_ms``): lease - 1 000, floored at 5 000.
``FACTORY_CONTROL_JOB_EXECUTION_TIMEOUT_MS`` may only lower it, and only for objective control
(``factory-control`` running ``factory.objective.control``); the 5 000 floor still applies after
the override.

Heartbeat cadence (``heartbeat_interval_ms``): min(lease, ``RECEIPT_RESONATE_ACTIVE_STALE_MS``
(600 000)) // 3, so a worker gets two renewal opportunities before the stale fence fires.
``RECEIPT_RESONATE_HEARTBEAT_INTERVAL_MS`` may only lower the derived value, never raise it. The
1 000 floor is applied last, i.e. ``max(1 000, min(derived, override))``: an override below
1 000 yields 1 000.

Driver invocation timeout (``driver_timeout_ms``): lease + 60 000, floored at 120 000.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from pydantic import Field

from receipts.settings import ReceiptSettings, Whole

__all__ = [
    "CODEX_AGENT_ID",
    "CODEX_LEASE_CAP_MS",
    "CODEX_TIMEOUT_MARGIN_MS",
    "COMPUTER_EXECUTION_PATH",
    "DRIVER_TIMEOUT_FLOOR_MS",
    "DRIVER_TIMEOUT_MARGIN_MS",
    "EXECUTION_TIMEOUT_FLOOR_MS",
    "EXECUTION_TIMEOUT_MARGIN_MS",
    "FACTORY_CONTROL_AGENT_ID",
    "FACTORY_MONITOR_AGENT_ID",
    "HEARTBEAT_FLOOR_MS",
    "HEARTBEAT_RENEWALS_PER_WINDOW",
    "OBJECTIVE_CONTROL_KIND",
    "TASK_MONITOR_KIND",
    "JobTiming",
    "TimingSettings",
    "derive",
    "driver_timeout_ms",
    "execution_timeout_ms",
    "heartbeat_interval_ms",
    "lease_ms",
]

FACTORY_CONTROL_AGENT_ID = "factory-control"
FACTORY_MONITOR_AGENT_ID = "factory-monitor"
CODEX_AGENT_ID = "codex"
OBJECTIVE_CONTROL_KIND = "factory.objective.control"
TASK_MONITOR_KIND = "factory.task.monitor"
COMPUTER_EXECUTION_PATH = "computer"

CODEX_TIMEOUT_MARGIN_MS = 300_000
CODEX_LEASE_CAP_MS = 3_600_000
EXECUTION_TIMEOUT_MARGIN_MS = 1_000
EXECUTION_TIMEOUT_FLOOR_MS = 5_000
HEARTBEAT_RENEWALS_PER_WINDOW = 3
HEARTBEAT_FLOOR_MS = 1_000
DRIVER_TIMEOUT_MARGIN_MS = 60_000
DRIVER_TIMEOUT_FLOOR_MS = 120_000


class TimingSettings(ReceiptSettings):
    """Leases, timeouts and heartbeats; each field reads the spec's variable and carries its
    default. ``None`` for an optional override means "unset": the derived value is used
    unchanged. Every value that is set must be a positive whole number."""

    accepts_any: ClassVar[str] = "a positive integer (milliseconds)"

    job_lease_ms: Whole = Field(default=300_000, gt=0, alias="JOB_LEASE_MS")
    factory_control_job_lease_ms: Whole = Field(
        default=900_000, gt=0, alias="FACTORY_CONTROL_JOB_LEASE_MS"
    )
    codex_job_lease_ms: Whole = Field(default=900_000, gt=0, alias="CODEX_JOB_LEASE_MS")
    factory_control_job_execution_timeout_ms: Whole | None = Field(
        default=None, gt=0, alias="FACTORY_CONTROL_JOB_EXECUTION_TIMEOUT_MS"
    )
    active_stale_ms: Whole = Field(default=600_000, gt=0, alias="RECEIPT_RESONATE_ACTIVE_STALE_MS")
    heartbeat_interval_ms: Whole | None = Field(
        default=None, gt=0, alias="RECEIPT_RESONATE_HEARTBEAT_INTERVAL_MS"
    )


@dataclass(frozen=True, slots=True)
class JobTiming:
    """All timing values for one job, in milliseconds."""

    lease_ms: int
    execution_timeout_ms: int
    heartbeat_interval_ms: int
    driver_timeout_ms: int


def _payload_timeout_ms(payload: Mapping[str, object]) -> int | None:
    """Top-level ``payload["timeoutMs"]`` when it is a finite positive number, else ``None``."""
    value = payload.get("timeoutMs")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int):
        # Compared as an int: a huge JSON integer must not overflow a float conversion.
        return value if value > 0 else None
    if not math.isfinite(value) or value <= 0:
        return None
    return math.ceil(value)


def _is_objective_control(agent_id: str, payload: Mapping[str, object]) -> bool:
    return agent_id == FACTORY_CONTROL_AGENT_ID and payload.get("kind") == OBJECTIVE_CONTROL_KIND


def _is_computer_monitor(agent_id: str, payload: Mapping[str, object]) -> bool:
    return (
        agent_id == FACTORY_MONITOR_AGENT_ID
        and payload.get("kind") == TASK_MONITOR_KIND
        and payload.get("executionPath") == COMPUTER_EXECUTION_PATH
    )


def lease_ms(agent_id: str, payload: Mapping[str, object], settings: TimingSettings) -> int:
    """The job's lease duration in milliseconds (see the module docstring's table)."""
    default = settings.job_lease_ms
    if _is_objective_control(agent_id, payload):
        return max(default, settings.factory_control_job_lease_ms)
    if _is_computer_monitor(agent_id, payload):
        return max(default, settings.codex_job_lease_ms)
    if agent_id == CODEX_AGENT_ID:
        timeout = _payload_timeout_ms(payload)
        if timeout is None:
            return settings.codex_job_lease_ms
        return max(
            settings.codex_job_lease_ms,
            min(timeout + CODEX_TIMEOUT_MARGIN_MS, CODEX_LEASE_CAP_MS),
        )
    return default


def execution_timeout_ms(
    agent_id: str, payload: Mapping[str, object], settings: TimingSettings
) -> int:
    """Lease - 1 000, floor 5 000; the objective-control override may only lower it."""
    timeout = lease_ms(agent_id, payload, settings) - EXECUTION_TIMEOUT_MARGIN_MS
    override = settings.factory_control_job_execution_timeout_ms
    if override is not None and _is_objective_control(agent_id, payload):
        timeout = min(timeout, override)
    return max(EXECUTION_TIMEOUT_FLOOR_MS, timeout)


def heartbeat_interval_ms(
    agent_id: str, payload: Mapping[str, object], settings: TimingSettings
) -> int:
    """min(lease, active stale window) // 3; the override may only lower it; floor 1 000."""
    window = min(lease_ms(agent_id, payload, settings), settings.active_stale_ms)
    interval = window // HEARTBEAT_RENEWALS_PER_WINDOW
    if settings.heartbeat_interval_ms is not None:
        interval = min(interval, settings.heartbeat_interval_ms)
    return max(HEARTBEAT_FLOOR_MS, interval)


def driver_timeout_ms(
    agent_id: str, payload: Mapping[str, object], settings: TimingSettings
) -> int:
    """Lease + 60 000, floor 120 000."""
    return max(
        DRIVER_TIMEOUT_FLOOR_MS,
        lease_ms(agent_id, payload, settings) + DRIVER_TIMEOUT_MARGIN_MS,
    )


def derive(agent_id: str, payload: Mapping[str, object], settings: TimingSettings) -> JobTiming:
    """Every timing value for a job posted to ``agent_id`` with ``payload``."""
    return JobTiming(
        lease_ms=lease_ms(agent_id, payload, settings),
        execution_timeout_ms=execution_timeout_ms(agent_id, payload, settings),
        heartbeat_interval_ms=heartbeat_interval_ms(agent_id, payload, settings),
        driver_timeout_ms=driver_timeout_ms(agent_id, payload, settings),
    )
