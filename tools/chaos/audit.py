"""The chaos verdict: every invariant checked from the receipt chain alone, and the recovery time
after each fault."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import psycopg

from receipts.assembly import verify
from receipts.audit import audit_chain
from receipts.jobs import TERMINAL_STATUSES
from receipts.objectives import store as objectives
from receipts.objectives.model import objective_stream
from receipts.sql import query
from tools.chaos.agents import agent_job_lines, open_agent_jobs
from tools.chaos.invariants import OBJECTIVE_INVARIANTS, objective_violations
from tools.chaos.load import objective_jobs
from tools.chaos.state import Run


async def recovery_times(run: Run) -> None:
    """Each fault's recovery: the time from the fault to the next settlement."""
    async with await psycopg.AsyncConnection.connect(run.db_url, autocommit=True) as conn:
        for fault in run.faults:
            if fault.at_db is None:
                continue
            cur = await conn.execute(
                query("tooling_first_settlement_after"), {"after": fault.at_db}
            )
            row = await cur.fetchone()
            if row and row[0] is not None:
                fault.recovery_s = (row[0] - fault.at_db).total_seconds()


@dataclass
class Verdict:
    """The invariants, each with its counts."""

    lines: list[tuple[bool, str]] = field(default_factory=list)
    lost: int = 0
    duplicates: int = 0
    stuck: int = 0

    def check(self, ok: bool, line: str) -> None:
        self.lines.append((ok, line))

    @property
    def ok(self) -> bool:
        return all(ok for ok, _ in self.lines)


async def audit(run: Run) -> Verdict:
    """Verify every invariant from the receipt chain alone."""
    assert run.store is not None
    verdict = Verdict()
    audits = {}
    of_objectives = await objective_jobs(run)
    for job_id in [*run.accepted, *of_objectives]:
        receipts = await run.store.read_stream(f"jobs/{job_id}")
        if not receipts or receipts[0].type != "job.enqueued":
            verdict.lost += 1
            continue
        audits[job_id] = audit_chain(job_id, receipts)
    total = len(run.accepted) + len(of_objectives)
    verdict.check(
        verdict.lost == 0,
        f"accepted enqueues with a stream: {total - verdict.lost}/{total} (lost {verdict.lost})",
    )
    verdict.duplicates = sum(
        a.terminal_transitions > 1 or bool(a.after_terminal) for a in audits.values()
    )
    one_terminal = sum(a.terminal_transitions == 1 for a in audits.values())
    verdict.check(
        verdict.duplicates == 0,
        f"exactly one terminal receipt: {one_terminal}/{len(audits)} (duplicate "
        f"settlements {verdict.duplicates})",
    )
    stale = sum(len(a.stale_fence_writes) for a in audits.values())
    verdict.check(stale == 0, f"settle/heartbeat/progress receipts under a stale fence: {stale}")
    verdict.stuck = sum(a.final_status not in TERMINAL_STATUSES for a in audits.values())
    statuses = Counter(a.final_status for a in audits.values())
    verdict.check(
        verdict.stuck == 0, f"jobs left non-terminal: {verdict.stuck} (final: {dict(statuses)})"
    )
    if run.poison is not None and run.poison in audits:
        poison = audits[run.poison].job
        assert poison is not None
        first_lease = next(
            (
                r.recorded_at
                for r in await run.store.read_stream(f"jobs/{run.poison}")
                if r.type == "job.leased"
            ),
            None,
        )
        completed_after = 0
        for job_id, chain in audits.items():
            if (
                job_id != run.poison
                and chain.job is not None
                and chain.job.settled_at
                and first_lease
                and chain.job.settled_at > first_lease
                and chain.final_status == "completed"
            ):
                completed_after += 1
        ok = poison.status == "failed" and poison.attempt == poison.max_attempts
        verdict.check(
            ok and completed_after > 0,
            f"poison job: {poison.status} after {poison.attempt}/{poison.max_attempts}"
            f" attempts ({poison.error}); {completed_after} other jobs completed "
            f"meanwhile",
        )
    await _objectives_settled(run, verdict)
    for ok, line in await agent_job_lines(run):
        verdict.check(ok, line)
    verdict.stuck += len(await open_agent_jobs(run))
    problems = await verify(run.store)
    verdict.check(
        not problems,
        f"projections rebuilt from the chain equal the live ones: {len(problems)} differences",
    )
    return verdict


async def _objectives_settled(run: Run, verdict: Verdict) -> None:
    """Every objective of the load settled and was audited, dispatched no try twice and no task
    before its dependencies completed (tools/chaos/invariants.py). (An objective may fail like
    any job: a task whose tries all lost their attempts to faults.)"""
    assert run.store is not None
    states = [await objectives.get(run.store, o) for o in run.objectives]
    settled = Counter(s.status if s else "missing" for s in states)
    audited = sum(1 for s in states if s is not None and s.audit is not None)
    broken: Counter[str] = Counter()
    for objective_id in run.objectives:
        chain = await run.store.read_stream(objective_stream(objective_id))
        found = objective_violations(chain)
        for name in OBJECTIVE_INVARIANTS:
            broken[name] += found.count(name)
    verdict.stuck += sum(1 for s in states if s is None or not s.terminal)
    terminal = sum(1 for s in states if s is not None and s.terminal)
    retried = sum(
        1 for s in states if s is not None and any(len(task.tries) > 1 for task in s.tasks)
    )
    verdict.check(
        terminal == len(states) and audited == len(states),
        f"objectives settled and audited: {terminal}/{len(states)} (final: {dict(settled)}, "
        f"audited {audited}, a task retried in {retried}, cancel answers "
        f"{dict(run.objective_cancels)})",
    )
    for name in OBJECTIVE_INVARIANTS:
        verdict.check(broken[name] == 0, f"{name}: {broken[name]}")
