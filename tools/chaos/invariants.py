"""Invariants of agent jobs and objectives, read from the receipt chains alone (pure: receipts in,
violations out), so a chaos run can check them after any fault and a test can hand each one a
chain that breaks it.

Agent jobs (receipts/agent_jobs/model.py): never more than `SLOTS_PER_AGENT` running per agent
at any commit (the transitions replayed in commit order, by position); every transition allowed
by the table and from the status the job was in; exactly one `session.wakeup` per (job, status,
attempt, turn) of a wakeup status, and none of any other; no attempt past `MAX_ATTEMPTS`; every
job terminal or waiting on its user at the end, and every slot free (the same replay's running
count per agent back at 0).

Objectives (receipts/objectives/model.py): each task try dispatched once; a task dispatched only
after every task it depends on settled `completed`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from receipts.agent_jobs.decisions import MAX_ATTEMPTS
from receipts.agent_jobs.model import (
    CREATED,
    SLOTS_PER_AGENT,
    TERMINAL_STATUSES,
    TRANSITIONED,
    TURN_STARTED,
    WAKEUP,
    WAKEUP_STATUSES,
    transition_allowed,
    wakeup_source_id,
)
from receipts.streams import Receipt


@dataclass
class Violations:
    """Each invariant by name, with what broke it (empty: it held)."""

    found: dict[str, list[str]] = field(default_factory=dict)

    def add(self, invariant: str, what: str) -> None:
        self.found.setdefault(invariant, []).append(what)

    def count(self, invariant: str) -> int:
        return len(self.found.get(invariant, []))


# Names of the agent-job invariants, as the chaos run prints them.
SLOTS = "more than three running per agent"
TRANSITION = "transitions outside the table"
WAKEUP_ONCE = "wakeups missing or doubled"
WAKEUP_OTHER = "wakeups of a status that has none"
SIXTH = "attempts past the fifth"
OPEN_AT_END = "agent jobs neither terminal nor waiting at the end"
SLOTS_AT_END = "slots still held at the end"
AGENT_JOB_INVARIANTS = (
    SLOTS,
    TRANSITION,
    WAKEUP_ONCE,
    WAKEUP_OTHER,
    SIXTH,
    OPEN_AT_END,
    SLOTS_AT_END,
)
# And the objectives'.
TRY_TWICE = "task tries dispatched twice"
BEFORE_DEPENDENCY = "tasks dispatched before their dependencies completed"
OBJECTIVE_INVARIANTS = (TRY_TWICE, BEFORE_DEPENDENCY)


def agent_job_violations(
    chains: Mapping[str, Sequence[Receipt]], wakeups: Iterable[Receipt]
) -> Violations:
    """Check every agent-job invariant over `chains` (agent job id → its `agent-jobs/<id>`
    receipts) and the `session.wakeup` receipts of their owners' sessions."""
    found = Violations()
    agent_of: dict[str, str] = {}
    status_of: dict[str, str] = {}
    expected: Counter[str] = Counter()  # wakeup source ids the transitions owe
    transitions: list[tuple[int, str, str, str]] = []  # (position, job, from, to)
    for job_id, chain in chains.items():
        attempt = turn = 0  # as the reducer keeps them: a receipt that names one sets it
        for receipt in chain:
            if receipt.type == CREATED:
                agent_of[job_id] = str(receipt.data.get("agentId"))
                status_of[job_id] = "queued"
                continue
            if receipt.type in (TRANSITIONED, TURN_STARTED):
                turn = int(receipt.data.get("turn", turn))
            if receipt.type != TRANSITIONED:
                continue
            attempt = int(receipt.data.get("attempt", attempt))
            _check_transition(found, job_id, status_of.get(job_id), receipt, attempt)
            to = str(receipt.data["to"])
            status_of[job_id] = to
            transitions.append((receipt.position, job_id, str(receipt.data["from"]), to))
            if to in WAKEUP_STATUSES:
                expected[wakeup_source_id(job_id, to, attempt, turn)] += 1
    _check_slots(found, agent_of, transitions)
    _check_wakeups(found, expected, wakeups, set(chains))
    for job_id, status in status_of.items():
        if status not in TERMINAL_STATUSES and status != "waiting_on_user":
            found.add(OPEN_AT_END, f"{job_id} is {status}")
    return found


def _check_transition(
    found: Violations, job_id: str, status: str | None, r: Receipt, attempt: int
) -> None:
    start, to = str(r.data["from"]), str(r.data["to"])
    if status is None or start != status or not transition_allowed(start, to):
        found.add(TRANSITION, f"{job_id} seq {r.seq}: {start} -> {to} (was {status})")
    if attempt > MAX_ATTEMPTS:
        found.add(SIXTH, f"{job_id} seq {r.seq}: attempt {attempt}")


def _check_slots(
    found: Violations, agent_of: Mapping[str, str], transitions: list[tuple[int, str, str, str]]
) -> None:
    running: Counter[str] = Counter()
    for position, job_id, start, to in sorted(transitions):
        agent = agent_of.get(job_id, "?")
        running[agent] += (to == "running") - (start == "running")
        if running[agent] > SLOTS_PER_AGENT:
            found.add(SLOTS, f"agent {agent}: {running[agent]} running at position {position}")
    for agent, held in sorted(running.items()):
        if held:
            found.add(SLOTS_AT_END, f"agent {agent}: {held} running after the last commit")


def _check_wakeups(
    found: Violations, expected: Counter[str], wakeups: Iterable[Receipt], jobs: set[str]
) -> None:
    written: Counter[str] = Counter()
    for wakeup in wakeups:
        if wakeup.type != WAKEUP or wakeup.data.get("agentJobId") not in jobs:
            continue
        if wakeup.data.get("status") not in WAKEUP_STATUSES:
            found.add(WAKEUP_OTHER, f"{wakeup.data.get('sourceId')}")
            continue
        written[str(wakeup.data.get("sourceId"))] += 1
    for source in expected.keys() | written.keys():
        if written[source] != 1 or expected[source] != 1:
            found.add(WAKEUP_ONCE, f"{source}: owed {expected[source]}, written {written[source]}")


def objective_violations(chain: Sequence[Receipt]) -> Violations:
    """Check one objective's chain: each task try dispatched once, and never before the tasks
    it depends on settled `completed`."""
    found = Violations()
    depends: dict[str, list[str]] = {}
    completed: set[str] = set()
    tries: Counter[tuple[str, int]] = Counter()
    for receipt in chain:
        data = receipt.data
        if receipt.type in ("objective.created", "objective.phase_added"):
            for task in data.get("tasks") or ():
                depends[str(task["taskId"])] = [str(d) for d in task.get("dependsOn") or ()]
        elif receipt.type == "objective.task.dispatched":
            task_id = str(data["taskId"])
            tries[(task_id, int(data.get("try", 1)))] += 1
            missing = [d for d in depends.get(task_id, ()) if d not in completed]
            if missing:
                found.add(BEFORE_DEPENDENCY, f"{task_id} before {', '.join(missing)}")
        elif receipt.type == "objective.task.settled" and data.get("status") == "completed":
            completed.add(str(data["taskId"]))
    for (task_id, attempt), n in tries.items():
        if n > 1:
            found.add(TRY_TWICE, f"{task_id} try {attempt}: {n} dispatches")
    return found
