"""Recovery after SIGKILL: a codex job runs `sleep` at the spec's default leases (codex 900 s,
a `job.heartbeat` cadence of 200 s), its worker-codex process is SIGKILLed mid-command with
everything it started and started again at once, as a Deployment restarts a killed pod.

Temporal finds the lost worker by the attempt activity's heartbeat timeout
(`RECEIPT_WORKER_LOST_TIMEOUT_MS`, 30 s by default), delivers the attempt again, and the new
delivery takes the lease over through the start-fence and runs the command again. Measured on
the receipts' clock (the database's): kill → the redelivery's start-fence heartbeat, and kill →
the terminal receipt. The target is kill → settled ≤ the worker-lost timeout plus the
redelivery's takeover grace (`TAKEOVER_GRACE_S`, 0.5 s: a first delivery still alive, its worker
cut off from Temporal only, stops its handler before the new one starts its own) plus the
command's own run time; when attempts were child workflows it was two receipt cadences, ~400 s.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from activities.attempt_watch import TAKEOVER_GRACE_S
from receipts.sql import query
from tools.bench.config import TERMINAL_TYPES, BenchError, true_payload
from tools.bench.load import HttpConnection, post_request

if TYPE_CHECKING:
    from tools.bench.run import Bench

WORKER = "worker-codex"
WORKER_LOST_S = 30.0  # RECEIPT_WORKER_LOST_TIMEOUT_MS's default; the bench leaves it unset
WAIT_S = 180.0  # far above the target, far below the ~400 s it bounded before


@dataclass(frozen=True)
class Recovery:
    """One SIGKILL: seconds from the kill to the takeover and to the settle, on the database's
    clock, and what the chain holds afterwards."""

    run_s: float  # the command's own run time (`sleep run_s`)
    takeover_s: float  # kill → the redelivery's start-fence `job.heartbeat`
    settled_s: float  # kill → the terminal receipt
    status: str  # the terminal receipt's type
    settles: int  # terminal receipts on the chain: exactly one is the rule
    taken_over_by: str  # the workerId that took the lease over (`<jobId>:attempt:<n>.<run>/<k>`)

    @property
    def goal_s(self) -> float:
        return WORKER_LOST_S + TAKEOVER_GRACE_S + self.run_s

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "goalS": self.goal_s}


@dataclass(frozen=True)
class ChainEntry:
    type: str
    worker_id: str | None
    start_fence: bool
    at: float  # epoch seconds, the database's clock


def read_recovery(chain: Sequence[ChainEntry], killed_at: float, run_s: float) -> Recovery:
    """The figures of one kill from the job's chain (pure: unit-tested)."""
    takeover = next(
        (e for e in chain if e.type == "job.heartbeat" and e.start_fence and e.at > killed_at),
        None,
    )
    terminal = [e for e in chain if e.type in TERMINAL_TYPES]
    if takeover is None or not terminal:
        missing = "no start-fence heartbeat after the kill" if takeover is None else "no settle"
        raise BenchError(f"recovery: {missing} on the job's chain")
    return Recovery(
        run_s=run_s,
        takeover_s=takeover.at - killed_at,
        settled_s=terminal[0].at - killed_at,
        status=terminal[0].type,
        settles=len(terminal),
        taken_over_by=takeover.worker_id or "",
    )


async def measure_recovery(
    bench: Bench, db: Any, port: int, db_url: str, env: Mapping[str, str], run_s: float
) -> Recovery:
    """Post a `sleep run_s` job, SIGKILL the worker-codex holding it (and its children) half a
    second into the command, start worker-codex again (with `env`), and read the chain once
    settled."""
    assert bench.processes is not None
    payload = {**true_payload("bench-recovery"), "task": {"command": ["sleep", f"{run_s:g}"]}}
    conn = HttpConnection("127.0.0.1", port)
    try:
        status, body = await conn.request(
            post_request("127.0.0.1", port, "/agents/codex/jobs", {"payload": payload})
        )
    finally:
        await conn.close()
    if status != 202:
        raise BenchError(f"recovery: enqueue answered {status}: {body[:300]!r}")
    job_id = json.loads(body)["async"]["jobId"]
    await _wait_chain(db, job_id, lambda chain: any(e.type == "job.leased" for e in chain), 60)
    await asyncio.sleep(0.5)  # the command is running
    killed_at = await _now(db)
    pid = bench.processes.kill(WORKER)
    bench.say(f"recovery: SIGKILLed {WORKER} (pid {pid}) mid-command; starting it again")
    bench.start_role(WORKER, db_url, **env)
    chain = await _wait_chain(
        db, job_id, lambda c: any(e.type in TERMINAL_TYPES for e in c), WAIT_S + run_s
    )
    return read_recovery(chain, killed_at, run_s)


async def _now(db: Any) -> float:
    cur = await db.execute(query("tooling_clock"))
    row = await cur.fetchone()
    return float(row[0])


async def _chain(db: Any, job_id: str) -> list[ChainEntry]:
    cur = await db.execute(query("tooling_job_chain"), {"stream": f"jobs/{job_id}"})
    return [ChainEntry(t, w, bool(f), float(at)) for t, w, f, at in await cur.fetchall()]


async def _wait_chain(
    db: Any, job_id: str, done: Callable[[list[ChainEntry]], bool], timeout_s: float
) -> list[ChainEntry]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        chain = await _chain(db, job_id)
        if done(chain):
            return chain
        await asyncio.sleep(0.2)
    raise BenchError(f"recovery: job {job_id} not there within {timeout_s:.0f} s")
