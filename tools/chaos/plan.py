"""What a chaos run does: its configuration, the seeded fault schedule and the job mix."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

FAULT_KINDS: tuple[str, ...] = (
    "kill_worker",
    "kill_driver",
    "kill_driver_claim",
    "kill_api",
    "stop_worker",
    "restart_postgres",
    "restart_temporal",
)
LEASE_MS = 8_000
# A post is tried this many times, half a second apart: an api killed by a fault is back within
# them (a retried post names its job, so it is the same job).
POST_TRIES = 12


@dataclass
class ChaosConfig:
    """How long, how fast, which faults, and how long to wait for the queue to drain."""

    duration_s: float = 600.0
    rate: float = 2.0
    seed: int = 1
    faults: tuple[str, ...] = FAULT_KINDS
    per_kind: int | None = None
    drain_timeout_s: float = 300.0
    workers: int = 2
    keep_dir: Path | None = None


@dataclass
class Fault:
    """One injected fault and what followed it."""

    kind: str
    planned_s: float
    target: str = ""
    at_s: float | None = None
    at_db: datetime | None = None
    recovery_s: float | None = None
    note: str = ""  # why it was not injected (skipped, failed)
    detail: str = ""  # what it hit, when it was injected


def plan_faults(config: ChaosConfig) -> list[Fault]:
    """Spread each fault kind `per_kind` times over 10 %..80 % of the run, seeded."""
    rng = random.Random(config.seed)
    per_kind = config.per_kind or max(1, int(config.duration_s // 300))
    kinds = [kind for kind in config.faults for _ in range(per_kind)]
    rng.shuffle(kinds)
    start, end = 0.10 * config.duration_s, 0.80 * config.duration_s
    step = (end - start) / max(1, len(kinds))
    return [
        Fault(kind, start + i * step + rng.uniform(0, step * 0.5)) for i, kind in enumerate(kinds)
    ]


def job_mix(rng: random.Random) -> tuple[str, dict[str, Any], int]:
    """One job of the load: `(shape, payload extra, maxAttempts)`."""
    roll = rng.random()
    if roll < 0.45:
        return "quick", {"task": {"command": ["true"]}}, 2
    if roll < 0.70:
        seconds = f"{rng.uniform(1.5, 4.0):.1f}"
        return "slow", {"task": {"command": ["sleep", seconds]}}, 3
    if roll < 0.85:
        return "failing", {"task": {"command": ["false"]}, "retryable": True}, 2
    return "aborted", {"task": {"command": ["sleep", "6"]}}, 2
