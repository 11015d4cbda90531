"""The chaos run's agent-job and objective invariants (tools/chaos/invariants.py), each against
a constructed chain that keeps it and one that breaks it: a checker that cannot fail is caught."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import count
from typing import Any

from receipts.streams import Receipt
from tools.chaos.invariants import (
    AGENT_JOB_INVARIANTS,
    BEFORE_DEPENDENCY,
    OPEN_AT_END,
    SIXTH,
    SLOTS,
    SLOTS_AT_END,
    TRANSITION,
    TRY_TWICE,
    WAKEUP_ONCE,
    WAKEUP_OTHER,
    agent_job_violations,
    objective_violations,
)

AT = datetime(2026, 12, 3, tzinfo=UTC)
POSITIONS = count(1)


def receipt(stream: str, seq: int, kind: str, **data: Any) -> Receipt:
    return Receipt(stream, seq, kind, data, AT, next(POSITIONS))


class Chain:
    """An agent job's chain built step by step, with the wakeups its steps owe."""

    def __init__(self, job_id: str, agent: str = "a") -> None:
        self.job_id = job_id
        self.receipts = [receipt(f"agent-jobs/{job_id}", 1, "agent_job.created", agentId=agent)]
        self.status = "queued"
        self.wakeups: list[Receipt] = []

    def to(self, status: str, attempt: int = 1, turn: int = 0, wake: bool = True) -> Chain:
        seq = len(self.receipts) + 1
        self.receipts.append(
            receipt(
                f"agent-jobs/{self.job_id}",
                seq,
                "agent_job.transitioned",
                **{"from": self.status, "to": status, "attempt": attempt, "turn": turn},
            )
        )
        self.status = status
        if wake and status in ("waiting_on_user", "succeeded", "failed"):
            self.wake(status, attempt, turn)
        return self

    def wake(self, status: str, attempt: int, turn: int) -> None:
        source = f"{self.job_id}:{status}:{attempt}:{turn}"
        self.wakeups.append(
            receipt(
                "sessions/s",
                len(self.wakeups) + 1,
                "session.wakeup",
                sourceId=source,
                agentJobId=self.job_id,
                status=status,
            )
        )


def check(*chains: Chain, extra_wakeups: tuple[Receipt, ...] = ()) -> dict[str, int]:
    found = agent_job_violations(
        {c.job_id: c.receipts for c in chains},
        [w for c in chains for w in c.wakeups] + list(extra_wakeups),
    )
    return {name: found.count(name) for name in AGENT_JOB_INVARIANTS if found.count(name)}


def test_a_clean_run_keeps_every_agent_job_invariant() -> None:
    asked = Chain("j1").to("running").to("waiting_on_user").to("running", turn=1)
    asked.to("succeeded", turn=1)
    retried = Chain("j2").to("running").to("queued").to("running", attempt=2).to("failed", 2)
    assert check(asked, retried) == {}


def test_a_fourth_running_job_of_one_agent_is_a_slot_violation() -> None:
    jobs = [Chain(f"j{n}").to("running") for n in range(4)]
    for job in jobs:
        job.to("succeeded")
    assert check(*jobs) == {SLOTS: 1}
    # The same four, each settled before the next starts: never more than one running.
    serial = [Chain(f"s{n}") for n in range(4)]
    for job in serial:
        job.to("running").to("succeeded")
    assert check(*serial) == {}
    # Four at once but of two agents: two each.
    mixed = [Chain(f"m{n}", agent=f"agent-{n % 2}").to("running") for n in range(4)]
    for job in mixed:
        job.to("succeeded")
    assert check(*mixed) == {}


def test_a_transition_outside_the_table_or_from_another_status_is_caught() -> None:
    job = Chain("j").to("running").to("succeeded")
    job.to("running")  # succeeded -> running: not in the table
    assert check(job)[TRANSITION] == 1
    liar = Chain("k").to("running")
    liar.status = "waiting_on_user"  # the next receipt claims a status the job was not in
    liar.to("running", wake=False)
    assert check(liar)[TRANSITION] == 1


def test_a_missing_or_doubled_wakeup_and_one_of_another_status_are_caught() -> None:
    silent = Chain("j").to("running").to("succeeded", wake=False)
    assert check(silent) == {WAKEUP_ONCE: 1}
    doubled = Chain("k").to("running").to("succeeded")
    doubled.wake("succeeded", 1, 0)
    assert check(doubled) == {WAKEUP_ONCE: 1}
    stray = Chain("m").to("running").to("stopped")
    stray.wake("stopped", 1, 0)
    assert check(stray) == {WAKEUP_OTHER: 1}


def test_a_sixth_attempt_and_a_job_left_running_are_caught() -> None:
    job = Chain("j")
    for attempt in range(1, 6):
        job.to("running", attempt=attempt).to("queued", attempt=attempt)
    job.to("running", attempt=6).to("failed", attempt=6)
    assert check(job) == {SIXTH: 2}
    left = Chain("k").to("running")
    assert check(left) == {OPEN_AT_END: 1, SLOTS_AT_END: 1}
    waiting = Chain("w").to("running").to("waiting_on_user")
    assert check(waiting) == {}


def objective(*receipts: tuple[str, dict[str, Any]]) -> list[Receipt]:
    tasks = [{"taskId": "a"}, {"taskId": "b", "dependsOn": ["a"]}]
    chain = [receipt("objectives/o", 1, "objective.created", tasks=tasks)]
    for seq, (kind, data) in enumerate(receipts, 2):
        chain.append(receipt("objectives/o", seq, kind, **data))
    return chain


def test_objective_tries_once_each_and_dependants_after_their_dependencies() -> None:
    ok = objective(
        ("objective.task.dispatched", {"taskId": "a", "try": 1}),
        ("objective.task.settled", {"taskId": "a", "try": 1, "status": "failed"}),
        ("objective.task.dispatched", {"taskId": "a", "try": 2}),
        ("objective.task.settled", {"taskId": "a", "try": 2, "status": "completed"}),
        ("objective.task.dispatched", {"taskId": "b", "try": 1}),
    )
    assert objective_violations(ok).found == {}
    early = objective(
        ("objective.task.dispatched", {"taskId": "a", "try": 1}),
        ("objective.task.settled", {"taskId": "a", "try": 1, "status": "failed"}),
        ("objective.task.dispatched", {"taskId": "b", "try": 1}),
    )
    assert objective_violations(early).count(BEFORE_DEPENDENCY) == 1
    twice = objective(
        ("objective.task.dispatched", {"taskId": "a", "try": 1}),
        ("objective.task.dispatched", {"taskId": "a", "try": 1}),
    )
    assert objective_violations(twice).count(TRY_TWICE) == 1
