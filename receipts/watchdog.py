"""Factory objective watchdog settings and scan (pure settings; the scan reads the store)."""

from __future__ import annotations

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
        from receipts.settings import WatchdogEnv  # the settings layer imports this module

        return WatchdogEnv.load(env).watchdog()
