"""The pure decisions of an agent job's lifecycle: when it may be claimed and what the claim
writes, what a settled turn does to it (docs/agent-jobs.md, Settlement), its budgets and retry
delays, and the transitions of a stop and of an input timeout. No I/O here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from receipts.agent_jobs.model import AgentJob, queue_job_id
from receipts.errors import InvariantError
from receipts.streams import time_of

MAX_ATTEMPTS = 5
MAX_CONSECUTIVE_FAILURES = 5
MAX_RETRY_DELAY_MS = 30_000
DEFAULT_RETRY_BASE_MS = 1_000


@dataclass(frozen=True, slots=True)
class Claim:
    """A claim's transition data and the queue job it enqueues."""

    data: dict[str, Any]
    queue_job_id: str
    continuation: bool


def claimable(job: AgentJob, now: datetime) -> bool:
    """True when the job waits only for a slot: queued and available, or answered."""
    if job.status == "queued":
        return job.available_at is None or job.available_at <= now
    return job.answer_pending


def _next_queue_id(job: AgentJob, attempt: int, turn: int) -> str:
    first = queue_job_id(job.agent_job_id, attempt)
    return (
        first if first not in job.queue_job_ids else queue_job_id(job.agent_job_id, attempt, turn)
    )


def claim(job: AgentJob, now: datetime) -> Claim:
    """The transition to `running`: a new attempt from `queued`, a continuation from an answer.

    Raises `InvariantError` when the job is not claimable or its attempts are spent.
    """
    if not claimable(job, now):
        raise InvariantError(f"agent job {job.agent_job_id} ({job.status}) is not claimable")
    turn = job.turn + 1
    if job.status == "queued":
        attempt = job.attempt + 1
        if attempt > MAX_ATTEMPTS:
            raise InvariantError(
                f"agent job {job.agent_job_id} has used its {MAX_ATTEMPTS} attempts"
            )
        queue_id = _next_queue_id(job, attempt, turn)
        continuation = False
    else:
        attempt = job.attempt
        queue_id = queue_job_id(job.agent_job_id, attempt, turn)
        continuation = True
    data = {
        "from": job.status,
        "to": "running",
        "attempt": attempt,
        "turn": turn,
        "consecutiveFailures": job.consecutive_failures,
        "queueJobId": queue_id,
        "reason": "continuation" if continuation else "attempt",
    }
    return Claim(data, queue_id, continuation)


@dataclass(frozen=True, slots=True)
class TurnReport:
    """What the turn's queue job says: its status, whether it ever ran, its result, and the
    follow-ups sent to it (those its handler read and those it ended without reading)."""

    status: str
    started: bool
    result: Any = None
    error: str | None = None
    follow_ups: tuple[Any, ...] = ()
    # An earlier turn of the job ended its work (`done`, `needs_input`: a continuation after an
    # answer, a follow-up's turn): a refund of this one keeps `startedAt`, the job did start.
    earlier_turn_ran: bool = False


@dataclass(frozen=True, slots=True)
class Settlement:
    """What a settled turn does to the agent job: a transition, or the next turn."""

    transition: dict[str, Any] | None = None
    next_turn: int | None = None
    next_prompt: Any = None


def retry_delay_ms(
    attempt: int, requested_ms: Any = None, base_ms: int = DEFAULT_RETRY_BASE_MS
) -> int:
    """The delay before the next attempt: the turn's `retryDelayMs` or `base × 2^(attempt-1)`,
    never more than 30 s and never negative."""
    if isinstance(requested_ms, int) and not isinstance(requested_ms, bool):
        wanted = requested_ms
    else:
        wanted = base_ms * 2 ** max(attempt - 1, 0)
    return max(0, min(MAX_RETRY_DELAY_MS, wanted))


def _outcome(report: TurnReport) -> Mapping[str, Any]:
    if report.status == "completed" and isinstance(report.result, Mapping):
        return report.result
    return {}


def decide_settlement(
    job: AgentJob, report: TurnReport, now: datetime, *, retry_base_ms: int = DEFAULT_RETRY_BASE_MS
) -> Settlement:
    """Decide what the settled turn of a running job does (see docs/agent-jobs.md, Settlement).

    Follow-ups reach the next turn whatever this one's outcome: a turn that ended its work
    (`done`, `needs_input`) took the ones it was given, so the ones sent to it are carried on;
    a turn that never started, or did not end its work (it failed, its worker died, it met a
    quota), hands its own on with them. Every transition out of `running` records what is
    carried (`followUps`)."""
    outcome = _outcome(report)
    kind = outcome.get("outcome")
    carried = list(report.follow_ups)
    if not report.started or kind not in ("done", "needs_input"):
        carried = [*(job.follow_up or []), *carried]
    base = {"from": "running", "attempt": job.attempt, "turn": job.turn, "followUps": carried}
    if job.cancel_requested:
        return Settlement(
            {
                **base,
                "to": "stopped",
                "consecutiveFailures": job.consecutive_failures,
                "reason": "canceled",
                "error": job.cancel_reason or "canceled",
                "result": {"turn": dict(outcome)} if outcome else None,
            }
        )
    if not report.started:
        refunded = max(job.attempt - 1, 0)
        return Settlement(
            {
                **base,
                "to": "queued",
                "attempt": refunded,
                "consecutiveFailures": job.consecutive_failures,
                "refunded": True,
                "clearStartedAt": refunded == 0 and not report.earlier_turn_ran,
                "reason": "unstarted",
                "error": report.error,
            }
        )
    if kind == "done":
        if carried:
            return Settlement(next_turn=job.turn + 1, next_prompt=carried)
        return Settlement(
            {
                **base,
                "to": "succeeded",
                "consecutiveFailures": 0,
                "reason": "done",
                "result": outcome.get("result"),
                "error": None,
            }
        )
    if kind == "needs_input":
        return Settlement(
            {
                **base,
                "to": "waiting_on_user",
                "consecutiveFailures": 0,
                "reason": "needs_input",
                "pendingToolCall": {
                    "toolCallId": str(outcome.get("toolCallId")),
                    "question": str(outcome.get("question")),
                },
            }
        )
    if kind == "quota_exhausted" and outcome.get("retryAt"):
        retry_at = time_of(outcome, "retryAt")
        assert retry_at is not None
        refunded = max(job.attempt - 1, 0)
        return Settlement(
            {
                **base,
                "to": "queued",
                "attempt": refunded,
                "consecutiveFailures": job.consecutive_failures,
                "availableAt": max(retry_at, now).isoformat(),
                "refunded": True,
                # A placement delay: the attempt never got its model turn, as an unstarted one.
                "clearStartedAt": refunded == 0 and not report.earlier_turn_ran,
                "reason": "quota_delay",
                "error": "quota exhausted",
            }
        )
    return _failed_turn(job, report, outcome, now, base, retry_base_ms)


def _failed_turn(
    job: AgentJob,
    report: TurnReport,
    outcome: Mapping[str, Any],
    now: datetime,
    base: dict[str, Any],
    retry_base_ms: int,
) -> Settlement:
    kind = outcome.get("outcome")
    if kind == "failed":
        error = str(outcome.get("error") or "the turn failed")
        retryable = outcome.get("retryable", True) is not False
    elif kind == "quota_exhausted":
        error, retryable = "quota exhausted (no retryAt)", True
    elif report.status == "completed":
        error = str(outcome.get("error") or "the turn reported no outcome")
        retryable = True
    else:
        error = f"turn {report.status}: {report.error or 'no detail'}"
        retryable = True
    failures = job.consecutive_failures + 1
    if not retryable or failures >= MAX_CONSECUTIVE_FAILURES or job.attempt >= MAX_ATTEMPTS:
        if not retryable:
            why = "non-retryable"
        elif failures >= MAX_CONSECUTIVE_FAILURES:
            why = f"{MAX_CONSECUTIVE_FAILURES} consecutive turn failures"
        else:
            why = f"{MAX_ATTEMPTS} attempts used"
        return Settlement(
            {
                **base,
                "to": "failed",
                "consecutiveFailures": min(failures, MAX_CONSECUTIVE_FAILURES),
                "reason": why,
                "error": error,
            }
        )
    delay = retry_delay_ms(job.attempt, outcome.get("retryDelayMs"), retry_base_ms)
    return Settlement(
        {
            **base,
            "to": "queued",
            "consecutiveFailures": failures,
            "availableAt": (now + timedelta(milliseconds=delay)).isoformat(),
            "retryDelayMs": delay,
            "reason": "retry",
            "error": error,
        }
    )


def at_organization_cap(job: AgentJob, follow_ups: Any) -> dict[str, Any]:
    """The transition of a running job whose next turn cannot take its organization's share of
    the codex workers: back to `queued`, its attempt refunded (the claim that comes when a slot
    frees runs the same attempt again, with the next turn) and its follow-ups carried."""
    refunded = max(job.attempt - 1, 0)
    return {
        "from": "running",
        "to": "queued",
        "attempt": refunded,
        "turn": job.turn,
        "consecutiveFailures": job.consecutive_failures,
        "refunded": True,
        "reason": "organization_at_cap",
        "followUps": list(follow_ups or []),
    }


def stop_data(job: AgentJob, reason: str) -> dict[str, Any]:
    """The transition of a job straight to `stopped` (a cancel: from any status but a
    terminal one)."""
    return {
        "from": job.status,
        "to": "stopped",
        "attempt": job.attempt,
        "turn": job.turn,
        "consecutiveFailures": job.consecutive_failures,
        "reason": "canceled",
        "error": reason,
    }


def input_timeout_data(job: AgentJob, timeout_ms: int) -> dict[str, Any]:
    """The transition of a job that waited past the input timeout to `failed`."""
    return {
        "from": "waiting_on_user",
        "to": "failed",
        "attempt": job.attempt,
        "turn": job.turn,
        "consecutiveFailures": job.consecutive_failures,
        "reason": "input_timeout",
        "error": f"no answer within {timeout_ms} ms (RECEIPT_AGENT_JOB_INPUT_TIMEOUT_MS)",
    }
