"""What one bench run measures: the sizes of the quick and full presets, the targets it reads
from the ratios (never asserted), the jobs it enqueues (codex `true`, and the no-op job)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class BenchConfig:
    """Sizes of one run. `quick()` takes 4–6 minutes, `full()` 10–17 (idle machine to loaded)."""

    mode: str
    repetitions: int
    api_requests: int
    api_concurrency: tuple[int, ...]
    burn_jobs: int
    stream_rate: float
    stream_seconds: float
    enqueue_concurrency: int = 16
    worker_concurrency: int | None = None
    warmup_jobs: int = 10
    recoveries: int = 1  # SIGKILLs of worker-codex mid-command (tools/bench/recovery.py)
    recovery_run_s: float = 2.0  # the killed job's command: `sleep 2`
    profile: bool = False
    part: str = "all"
    temporal_db: str = "memory"

    @classmethod
    def quick(cls) -> BenchConfig:
        return cls("quick", 3, 300, (1, 16), 60, 5.0, 8.0)

    @classmethod
    def full(cls) -> BenchConfig:
        return cls("full", 5, 1000, (1, 16), 200, 5.0, 20.0)


def build_config(quick: bool, **overrides: Any) -> BenchConfig:
    """The preset (`quick` or full) with the options given on the command line applied."""
    config = BenchConfig.quick() if quick else BenchConfig.full()
    given = {k: v for k, v in overrides.items() if v is not None}
    return replace(config, **given)


# Targets, read from the ratios (issues 6, 11 and 28): never asserted.
TARGET_E2E_VS_ACTIVITY = 0.9  # burn-down jobs/s against the raw activity pipeline
TARGET_E2E_VS_CHILD = 1.8  # burn-down jobs/s against the raw child-workflow pipeline
TARGET_SETTLED_P50 = 1.2  # enqueue→settled p50 of the steady stream against the raw activity
TARGET_SANDBOXED_P50 = 1.1  # codex `true`'s against the raw pipeline running the same sandbox
TARGET_API_RATE = 0.6  # API enqueue against the raw append, at 1 and at 16 clients
TARGET_API_P99_RATIO = 2.0  # the API's p99 at 16 clients against the raw append's p99
TARGET_ROUND_TRIPS = 10.0  # PostgreSQL round trips per no-op job (tools/bench/roundtrips.py)
# And kill → settled after a SIGKILLed worker ≤ the worker-lost timeout plus the takeover grace
# plus the job's own run time: `Recovery.goal_s` (tools/bench/recovery.py).
TERMINAL_TYPES = ("job.completed", "job.failed", "job.canceled")
# Receipt's delivery with nothing to run: a job for an agent id without a handler is routed to
# worker-chat, leased, and settled `failed` (`No handler for agent '<agentId>'`, the spec's
# unknown-agent path) through the same transactions a completed job takes. It is the bench's
# no-op: every durable step of a job, no handler work, no command.
NO_HANDLER_AGENT = "bench-no-handler"
TRUE_PAYLOAD: dict[str, Any] = {
    "kind": "factory.task.run",
    "authContext": {"userId": "bench", "organizationId": "bench"},
    "task": {"command": ["true"]},
}


def true_payload(organization_id: str) -> dict[str, Any]:
    """The codex `true` payload, posted for `organization_id`."""
    return {**TRUE_PAYLOAD, "authContext": {"userId": "bench", "organizationId": organization_id}}


class BenchError(RuntimeError):
    """The bench could not finish a measurement (a process died, a run timed out)."""
