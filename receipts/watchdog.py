"""The Factory objective watchdog's settings, names and bounds (its scan is
receipts/objectives/watchdog.py, its tick activities/watchdog.py)."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import AfterValidator, Field

from receipts.settings import ReceiptSettings, Switch, Whole

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


def _floored(value: int) -> int:
    return max(TIMEOUT_FLOOR_MS, value)


def _clamped(value: int) -> int:
    return max(SCAN_LIMIT_MIN, min(SCAN_LIMIT_MAX, value))


class WatchdogSettings(ReceiptSettings):
    """The Factory objective watchdog's schedule and scan: the timeout floored at 10 000, the
    scan limit clamped to 1..2000."""

    accepts: ClassVar[dict[str, str]] = {
        "timeout_ms": "an integer (milliseconds)",
        "scan_limit": "an integer",
    }

    enabled: Switch = Field(default=True, alias="RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_ENABLED")
    cron: Annotated[str, AfterValidator(lambda v: v.strip() or DEFAULT_CRON)] = Field(
        default=DEFAULT_CRON, alias="RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_CRON"
    )
    timeout_ms: Annotated[Whole, AfterValidator(_floored)] = Field(
        default=TIMEOUT_DEFAULT_MS, alias="RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_TIMEOUT_MS"
    )
    scan_limit: Annotated[Whole, AfterValidator(_clamped)] = Field(
        default=SCAN_LIMIT_DEFAULT, alias="RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_SCAN_LIMIT"
    )
