"""Factory objective watchdog settings and scan (pure settings; the scan reads the store)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_CRON = "* * * * *"
TIMEOUT_DEFAULT_MS, TIMEOUT_FLOOR_MS = 60_000, 10_000
SCAN_LIMIT_DEFAULT, SCAN_LIMIT_MIN, SCAN_LIMIT_MAX = 200, 1, 2_000
REASONS: tuple[str, ...] = (
    "no_active_objective_work",
    "phase_supersession_has_active_stale_job",
    "active_objective_work_stalled",
)
WATCHDOG_KIND = "factory.objective.watchdog"
WATCHDOG_AGENT = "factory-control"
# Sandboxed execution is treated as stale only after 15 minutes (a computer-backed task can be
# quiet while its workspace syncs).
SANDBOX_STALE_MS = 15 * 60 * 1000


def watchdog_job_id(scheduled_time_iso: str) -> str:
    """`watchdog:<scheduledTime>`: one job per schedule tick, so a retried tick adds nothing."""
    return f"watchdog:{scheduled_time_iso}"


@dataclass(frozen=True)
class WatchdogSettings:
    """RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_{ENABLED,CRON,TIMEOUT_MS,SCAN_LIMIT}."""

    enabled: bool = True
    cron: str = DEFAULT_CRON
    timeout_ms: int = TIMEOUT_DEFAULT_MS
    scan_limit: int = SCAN_LIMIT_DEFAULT

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WatchdogSettings:
        """Read the watchdog settings; timeout floored at 10 000, limit clamped to 1..2000."""
        env = env if env is not None else os.environ
        prefix = "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_"
        enabled = env.get(prefix + "ENABLED", "1").strip().lower() not in ("0", "false", "no")
        cron = env.get(prefix + "CRON", "").strip() or DEFAULT_CRON
        timeout = _int(env, prefix + "TIMEOUT_MS", TIMEOUT_DEFAULT_MS)
        limit = _int(env, prefix + "SCAN_LIMIT", SCAN_LIMIT_DEFAULT)
        return cls(
            enabled=enabled,
            cron=cron,
            timeout_ms=max(TIMEOUT_FLOOR_MS, timeout),
            scan_limit=max(SCAN_LIMIT_MIN, min(SCAN_LIMIT_MAX, limit)),
        )


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
