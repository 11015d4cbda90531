"""The hostile tenant: organization A runs a steady mix alone (the quiet phase), then the same mix
again while organization B floods the api past its limits and runs commands that hit every
sandbox limit (the flood phase), in one sitting on one stack. Printed: A's enqueue p99 and
enqueue → settled p50 in both phases and their ratios, B's answers by status (429 and 413
expected, a 5xx to anyone is a failure), what each of B's commands came to, and the api's and
the codex workers' peak memory."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
import shutil
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from receipts.jobs import TERMINAL_STATUSES
from receipts.tenancy import scoped_id
from receipts.waits import within
from roles.infra.ports import free_port, wait_port
from tools.bench.processes import CpuMeter
from tools.chaos.hostile_b import (
    BOMBS,
    MAX_BODY_BYTES,
    ORG_B,
    OUTPUT_LINE,
    STREAMS_PER_CALLER,
    body_of,
    start_tenant_b,
)
from tools.chaos.plan import ChaosConfig
from tools.chaos.run import prepare_database, role_env, start_stack, stop_stack
from tools.chaos.state import Run

ORG_A = "tenant-a"
# The limits of the hostile stack: low enough that B reaches each of them within a short phase.
ENQUEUE_RATE, ENQUEUE_BURST = 5, 10  # per organization (A's steady rate stays below it)
MAX_QUEUED = 150  # per organization: B's flood also fills its queue
SANDBOX = {
    "RECEIPT_SANDBOX_PROCESSES": "64",
    "RECEIPT_SANDBOX_FILE_SIZE_MB": "16",
    "RECEIPT_SANDBOX_CPU_SECONDS": "3",
    "RECEIPT_SANDBOX_MEMORY_MB": "256",
}
MEMORY_SAMPLE_S = 0.5
LOAD = "load (A's client)"  # the CPU report's entry of this process
LOAD_B = "load (B, its own process)"


@dataclass
class Phase:
    """One phase's figures for organization A."""

    name: str
    enqueue_s: list[float] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    settled_s: list[float] = field(default_factory=list)
    open_at_end: int = 0


@dataclass
class Hostile:
    """What the hostile run saw."""

    quiet: Phase = field(default_factory=lambda: Phase("quiet"))
    flood: Phase = field(default_factory=lambda: Phase("flood"))
    answers_a: Counter[str] = field(default_factory=Counter)
    answers_b: Counter[str] = field(default_factory=Counter)
    streams_held: int = 0
    stream_refusal: str = ""
    bombs: dict[str, Counter[str]] = field(default_factory=dict)
    peak_rss_mib: Counter[str] = field(default_factory=Counter)
    output_rates: list[float] = field(default_factory=list)  # KiB/s read of each printer
    cpu: dict[str, dict[str, float]] = field(default_factory=dict)  # phase → process → CPU s

    @property
    def server_errors(self) -> int:
        return sum(
            n
            for answers in (self.answers_a, self.answers_b)
            for s, n in answers.items()
            if s.startswith("5")
        )


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile (0..1) of `values`, nearest rank; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def a_command(rng: random.Random) -> list[str]:
    """A's steady mix: mostly quick commands, some that take a second."""
    roll = rng.random()
    if roll < 0.6:
        return ["true"]
    if roll < 0.85:
        return ["sh", "-c", "echo a; echo b"]
    return ["sleep", "1"]


async def tenant_a(
    run: Run,
    http: httpx.AsyncClient,
    token: str,
    phase: Phase,
    seen: Hostile,
    rate: float,
    duration_s: float,
) -> None:
    """A's steady mix at `rate` jobs/s for `duration_s`: each post's latency, each job's id."""
    rng = random.Random(run.config.seed)
    headers = {"Authorization": f"Bearer {token}"}
    started = time.monotonic()
    pending: set[asyncio.Task[None]] = set()

    async def one(job_id: str, command: list[str]) -> None:
        began = time.perf_counter()
        try:
            response = await http.post(
                f"{run.api_url}/agents/codex/jobs",
                json=body_of(ORG_A, job_id, command),
                headers=headers,
                timeout=30,
            )
        except httpx.HTTPError as exc:
            seen.answers_a[type(exc).__name__] += 1
            return
        seen.answers_a[str(response.status_code)] += 1
        if response.status_code == 202:
            phase.enqueue_s.append(time.perf_counter() - began)
            phase.jobs.append(scoped_id(ORG_A, job_id))

    n = 0
    while time.monotonic() - started < duration_s:
        task = asyncio.create_task(one(f"a-{phase.name}-{n}", a_command(rng)))
        pending.add(task)
        task.add_done_callback(pending.discard)
        n += 1
        await asyncio.sleep(max(0.0, started + n / rate - time.monotonic()))
    await asyncio.gather(*pending)


async def settled_latencies(run: Run, phase: Phase, timeout_s: float) -> None:
    """Wait for A's jobs of `phase` to settle; their enqueue → settled times from the chain."""
    assert run.store is not None
    deadline = time.monotonic() + timeout_s
    waiting = list(phase.jobs)
    while waiting and time.monotonic() < deadline:
        still = []
        for job_id in waiting:
            job = await run.store.get_job(job_id)
            if job is None or job.status not in TERMINAL_STATUSES:
                still.append(job_id)
        waiting = still
        if waiting:
            await asyncio.sleep(0.5)
    phase.open_at_end = len(waiting)
    for job_id in phase.jobs:
        if job_id in waiting:
            continue
        chain = await run.store.read_stream(f"jobs/{job_id}")
        phase.settled_s.append((chain[-1].recorded_at - chain[0].recorded_at).total_seconds())


def cpu_now(run: Run) -> dict[str, float]:
    """CPU seconds so far of each role (with what it started), Temporal and this process (A's
    client: it shares the machine's cores with the stack it measures; its own children are the
    roles, counted apart). B's process reports its own (`LOAD_B`)."""
    pids = {name: role.pid for name, role in run.roles.items() if role.process}
    if run.temporal is not None and run.temporal.process is not None:
        pids["temporal"] = run.temporal.pid
    stack = list(pids)
    pids[LOAD] = os.getpid()
    return CpuMeter(pids, with_children=stack).snapshot()


def _rss_kib(pid: int) -> int:
    """Resident memory of `pid` and every process below it, in KiB (0 when gone)."""
    total = 0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            total += _rss_kib(int(child))
    return total


async def sample_memory(run: Run, seen: Hostile, stop: asyncio.Event) -> None:
    """The peak resident memory of the api and of each codex worker with its sandboxes."""
    while not stop.is_set():
        for name, role in run.roles.items():
            if name == "api" or name.startswith("worker-codex"):
                with contextlib.suppress(RuntimeError):
                    kib = _rss_kib(role.pid)
                    seen.peak_rss_mib[name] = max(seen.peak_rss_mib[name], kib // 1024)
        with contextlib.suppress(TimeoutError):
            await within(stop.wait(), MEMORY_SAMPLE_S)


async def output_pace(
    run: Run, http: httpx.AsyncClient, token: str, seen: Hostile, job_ids: list[str]
) -> None:
    """Stop B's endless printers (B aborts them: each would print until its execution timeout)
    and read from their progress receipts how fast the worker read them."""
    assert run.store is not None
    headers = {"Authorization": f"Bearer {token}"}
    for job_id in job_ids:
        chain = await run.store.read_stream(f"jobs/{job_id}")
        progress = [r for r in chain if r.type == "job.progress"]
        if len(progress) >= 2:
            seconds = (progress[-1].recorded_at - progress[0].recorded_at).total_seconds()
            lines = progress[-1].data["data"]["lines"] - progress[0].data["data"]["lines"]
            seen.output_rates.append(lines * (len(OUTPUT_LINE) + 1) / 1024 / max(seconds, 1e-3))
        with contextlib.suppress(httpx.HTTPError):
            await http.post(
                f"{run.api_url}/jobs/{job_id.split('~')[0]}/commands",
                json={"type": "abort", "reason": "hostile run over"},
                headers=headers,
            )


def ended_by(result: Any, error: str | None) -> str:
    """How a job of B's ended, in a few words: its exit code or its error's first clause."""
    if isinstance(result, dict) and "exitCode" in result:
        return f"exit {result['exitCode']}"
    return (error or "no error").split(";")[0][:60]


async def bomb_outcomes(
    run: Run, seen: Hostile, bomb_jobs: dict[str, list[str]], timeout_s: float
) -> None:
    """What each of B's commands came to: its job's status and result status, or still open."""
    assert run.store is not None
    deadline = time.monotonic() + timeout_s
    for kind, ids in bomb_jobs.items():
        outcomes: Counter[str] = Counter()
        for job_id in ids:
            while True:
                job = await run.store.get_job(job_id)
                if job is not None and job.status in TERMINAL_STATUSES:
                    outcomes[f"{job.status}: {ended_by(job.result, job.error)}"] += 1
                    break
                if time.monotonic() > deadline:
                    outcomes[f"open ({job.status if job else 'missing'})"] += 1
                    break
                await asyncio.sleep(0.5)
        seen.bombs[kind] = outcomes


def hostile_env(env: dict[str, str], token_a: str, token_b: str) -> dict[str, str]:
    """The hostile stack's settings: two organizations' tokens, real sandboxes, low limits."""
    return (
        env
        | SANDBOX
        | {
            "RECEIPT_API_TOKENS": f"{token_a} {ORG_A},{token_b} {ORG_B}",
            "RECEIPT_CODEX_SANDBOX": "bwrap",
            "RECEIPT_ORG_ENQUEUE_RATE": str(ENQUEUE_RATE),
            "RECEIPT_ORG_ENQUEUE_BURST": str(ENQUEUE_BURST),
            "RECEIPT_ORG_MAX_QUEUED": str(MAX_QUEUED),
            "RECEIPT_MAX_BODY_BYTES": str(MAX_BODY_BYTES),
            "RECEIPT_SSE_MAX_STREAMS_PER_CALLER": str(STREAMS_PER_CALLER),
        }
    )


async def hostile(config: ChaosConfig, a_rate: float = 3.0) -> int:
    """Run the quiet phase, then the flood phase, for `config.duration_s` each; print the report.
    0 unless a 5xx was answered, one of A's jobs was lost or left open, or a phase saw no job."""
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("receipts.store").setLevel(logging.WARNING)
    data_dir = (
        (config.keep_dir / "hostile")
        if config.keep_dir
        else Path(tempfile.mkdtemp(prefix="receipt-hostile-"))
    )
    data_dir.mkdir(parents=True, exist_ok=True)
    db_url, pgdata = await prepare_database(data_dir)
    temporal_port, api_port = free_port(), free_port()
    token_a, token_b = (f"hostile-{secrets.token_hex(16)}" for _ in range(2))
    base = role_env(
        dict(os.environ),
        f"hostile{uuid.uuid4().hex[:6]}-",
        db_url,
        f"127.0.0.1:{temporal_port}",
        api_port,
    ) | {"RECEIPT_DATA_DIR": str(data_dir / "data")}
    # The sandboxes' workspaces where every uid may traverse (the commands run as other uids):
    # not under `data_dir`, whose parents (a test's tmp_path: pytest keeps its own 0700) may
    # not be, whatever else made them traversable for a while.
    workspaces = Path(tempfile.mkdtemp(prefix="receipt-hostile-workspaces-"))
    os.chmod(workspaces, 0o711)
    env = hostile_env(base, token_a, token_b) | {"RECEIPT_WORKSPACE_ROOT": str(workspaces)}
    run = Run(config, data_dir, env, f"http://127.0.0.1:{api_port}", temporal_port, db_url, pgdata)
    logs = data_dir / "logs"
    logs.mkdir(exist_ok=True)
    seen = Hostile()
    bomb_jobs: dict[str, list[str]] = {}
    sampling = asyncio.Event()
    run.say(
        f"hostile tenant: {config.duration_s:.0f} s of {ORG_A} alone at {a_rate}/s, then "
        f"{config.duration_s:.0f} s with {ORG_B}'s flood; logs in {logs}"
    )
    await start_stack(run, logs, [])
    sampler = asyncio.create_task(sample_memory(run, seen, sampling))
    try:
        await wait_port(api_port, 60)
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
        async with httpx.AsyncClient(limits=limits) as http:
            run.say("stack up; the quiet phase starts")
            before = cpu_now(run)
            await tenant_a(run, http, token_a, seen.quiet, seen, a_rate, config.duration_s)
            seen.cpu["quiet"] = _spent(before, cpu_now(run))
            await settled_latencies(run, seen.quiet, 120)
            run.say(f"quiet phase settled; {ORG_B}'s flood starts beside {ORG_A}")
            before = cpu_now(run)
            b = await start_tenant_b(run.api_url, token_b, config.duration_s)
            await tenant_a(run, http, token_a, seen.flood, seen, a_rate, config.duration_s)
            tenant = await b
            seen.cpu["flood"] = _spent(before, cpu_now(run)) | {LOAD_B: tenant.cpu_s}
            seen.answers_b.update(tenant.answers)
            seen.streams_held, seen.stream_refusal = tenant.streams_held, tenant.stream_refusal
            bomb_jobs = tenant.bomb_jobs
            await settled_latencies(run, seen.flood, 120)
            await output_pace(run, http, token_b, seen, bomb_jobs.get("output", []))
            await bomb_outcomes(run, seen, bomb_jobs, 120)
    finally:
        sampling.set()
        await sampler
        await stop_stack(run)
    ok = report(seen, run)
    shutil.rmtree(workspaces, ignore_errors=True)
    if config.keep_dir is None and ok:
        shutil.rmtree(data_dir, ignore_errors=True)
    return 0 if ok else 1


def _spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before.get(name, 0.0) for name in after}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def report(seen: Hostile, run: Run) -> bool:
    """Print the comparison and B's answers; True unless a 5xx was answered, or a post of A's
    was not admitted, or one of A's jobs did not settle."""
    quiet, flood = seen.quiet, seen.flood
    print("\nhostile tenant (same stack, same sitting):")
    for phase in (quiet, flood):
        print(
            f"  {ORG_A} {phase.name:<5}: {len(phase.jobs)} jobs, enqueue p50 "
            f"{_ms(percentile(phase.enqueue_s, 0.5))} p99 {_ms(percentile(phase.enqueue_s, 0.99))}, "
            f"enqueue→settled p50 {_ms(percentile(phase.settled_s, 0.5))} "
            f"p99 {_ms(percentile(phase.settled_s, 0.99))}, open at the end {phase.open_at_end}"
        )
    p99_ratio = percentile(flood.enqueue_s, 0.99) / percentile(quiet.enqueue_s, 0.99)
    p50_ratio = percentile(flood.settled_s, 0.5) / percentile(quiet.settled_s, 0.5)
    print(f"  {ORG_A} answers: {dict(sorted(seen.answers_a.items()))}")
    print(f"  {ORG_B} answers: {dict(sorted(seen.answers_b.items()))}")
    print(f"  {ORG_B} event streams: held {seen.streams_held}, one more: {seen.stream_refusal}")
    for kind, outcomes in seen.bombs.items():
        print(f"  {ORG_B} command {kind:<9} {BOMBS[kind]}: {dict(outcomes)}")
    rates = ", ".join(f"{rate:.0f}" for rate in seen.output_rates)
    print(f"  {ORG_B}'s printers were read at KiB/s: {rates or 'none measured'}")
    print(f"  peak memory (MiB, a codex worker with its sandboxes): {dict(seen.peak_rss_mib)}")
    for name, spent in seen.cpu.items():
        shown = ", ".join(f"{role} {seconds:.1f}" for role, seconds in spent.items())
        print(f"  CPU seconds of the {name} phase (2 cores x its length at most): {shown}")
    restarts = {name: role.restarts for name, role in run.roles.items() if role.restarts}
    print(f"  supervisor restarts: {restarts or 'none'}")
    checks = [
        (p99_ratio <= 1.5, f"{ORG_A} enqueue p99 under the flood ≤ 1.5× quiet: {p99_ratio:.2f}×"),
        (p50_ratio <= 1.5, f"{ORG_A} settled p50 under the flood ≤ 1.5× quiet: {p50_ratio:.2f}×"),
        (seen.server_errors == 0, f"5xx answered to anyone: {seen.server_errors}"),
    ]
    for ok, line in checks:
        print(f"  {'ok  ' if ok else 'over'} target: {line}")
    lost = quiet.open_at_end + flood.open_at_end
    # Every post of A's must be admitted: a refusal, a timeout or a dropped connection is A hurt
    # by B, not a sample left out of the ratio.
    refused_a = sum(n for status, n in seen.answers_a.items() if status != "202")
    failed = seen.server_errors > 0 or lost > 0 or refused_a > 0 or not quiet.jobs or not flood.jobs
    print(
        f"hostile: 5xx {seen.server_errors}, {ORG_A} jobs unsettled {lost}, "
        f"{ORG_A} posts not admitted {refused_a}, "
        f"enqueue p99 {p99_ratio:.2f}×, settled p50 {p50_ratio:.2f}×"
    )
    return not failed
