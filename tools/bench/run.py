"""One bench run: its own stack (embedded PostgreSQL, a Temporal dev server and role processes
on free ports, so a running `make up` is left alone), the two parts it measures, the report.

Every figure is measured on Receipt and on its baselines back to back within each repetition,
the order alternating between repetitions (a drift of the machine hits every side alike).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from receipts import assembly
from receipts.sql import query
from roles.infra.ports import free_port, wait_port
from tools.bench.config import TRUE_PAYLOAD, BenchConfig, BenchError, true_payload
from tools.bench.load import HttpConnection, closed_loop, post_request
from tools.bench.processes import CpuMeter, Processes, role_env
from tools.bench.profile import Profiler
from tools.bench.raw import SANDBOXED
from tools.bench.recovery import Recovery, measure_recovery
from tools.bench.results import BARE, BARE_SUBJECT, CHILD, Pair, Run, summary
from tools.bench.roundtrips import RoundTrips, measure_round_trips
from tools.bench.stats import format_number, format_spread


def _named_on(statement: str, database: str) -> Any:
    """A tooling statement with `{name}` filled in as a quoted identifier."""
    from psycopg import sql

    return sql.SQL(statement).format(name=sql.Identifier(database))


def order(rep: int, sides: tuple[str, ...]) -> tuple[str, ...]:
    """The sides in the order repetition `rep` runs them: forward, then backward (ABBA)."""
    return sides if rep % 2 == 0 else tuple(reversed(sides))


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
    profiler: Profiler | None = None
    recoveries: list[Recovery] = field(default_factory=list)
    round_trips: RoundTrips | None = None

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs" / self.stamp

    @property
    def profiles(self) -> dict[str, str]:
        return self.profiler.profiles if self.profiler is not None else {}

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

    async def create_database(self, purpose: str) -> str:
        """A fresh, migrated database for one part of the run (dropped at the end)."""
        import psycopg
        from psycopg.conninfo import make_conninfo

        from roles.infra.db import migrate_url

        name = f"receipt_bench_{purpose}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(_named_on(query("tooling_create_database"), name))
        self.databases.append(name)
        url = make_conninfo(self.admin_url, dbname=name)
        await migrate_url(url)
        return url

    def _drop_databases(self) -> None:
        import psycopg

        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(self.admin_url, autocommit=True) as conn,
        ):
            for name in self.databases:
                conn.execute(_named_on(query("tooling_drop_database"), name))
        self.databases.clear()

    async def _start_temporal(self, tmp: Path) -> None:
        from temporalio.client import Client

        from roles.infra.temporal import temporal_argv

        assert self.processes is not None
        port = free_port()
        db_file = tmp / "temporal.sqlite" if self.config.temporal_db == "file" else None
        self.processes.start("temporal", temporal_argv(db_file, port, None))
        self.temporal_address = f"127.0.0.1:{port}"
        try:
            await wait_port(
                port, exited=self.processes.started["temporal"].returncode, name="temporal"
            )
        except RuntimeError as exc:
            raise BenchError(f"the Temporal dev server did not start: {exc}") from exc
        for _ in range(100):
            try:
                client = await Client.connect(self.temporal_address)
                await client.count_workflows()
                return
            except Exception:  # the namespace is not ready yet
                await asyncio.sleep(0.2)
        raise BenchError("the Temporal dev server did not become ready within 20 s")

    def start_role(self, role: str, db_url: str, **extra: str) -> None:
        assert self.processes is not None
        # One organization's throughput: fair dispatch across organizations would cap it at
        # that organization's share of the worker (README, Security: limits).
        env = role_env(
            db_url, self.temporal_address, {"RECEIPT_ORG_MAX_RUNNING_PER_GROUP": "0", **extra}
        )
        self.processes.start(role, [sys.executable, "-m", "roles.role", role], env)

    def start_api(self, db_url: str, fits: int = 0, **env: str) -> int:
        """Start the api role on a free port; return the port.

        It runs with production's caps on an organization's queued and active jobs (the
        defaults of RECEIPT_ORG_MAX_QUEUED and RECEIPT_ORG_MAX_ACTIVE, raised only where one
        organization must hold `fits` jobs at once), so each enqueue pays the check production
        pays. The enqueue rate limit, an in-memory token bucket per organization, is off: its
        default 50/s would measure the limit instead of the API.
        """
        from roles.api.settings import ApiSettings

        port = free_port()
        fields = ApiSettings.model_fields
        limits = {
            "RECEIPT_ORG_ENQUEUE_RATE": "1e9",
            "RECEIPT_ORG_ENQUEUE_BURST": str(10**9),
            "RECEIPT_ORG_REQUESTS_IN_FLIGHT": str(10**9),
            "RECEIPT_ORG_MAX_QUEUED": str(max(fields["org_max_queued"].default, fits)),
            "RECEIPT_ORG_MAX_ACTIVE": str(max(fields["org_max_active"].default, fits)),
        }
        self.start_role(
            "api",
            db_url,
            RECEIPT_API_PORT=str(port),
            RECEIPT_API_HOST="127.0.0.1",
            **{**limits, **env},
        )
        return port

    def start_raw(self, side: str, concurrency: int) -> None:
        """One side (`driver` or `worker`) of the raw pipelines, in a process of its own."""
        assert self.processes is not None
        env = role_env("", self.temporal_address, {})
        argv = [sys.executable, "-m", "tools.bench.raw", self.temporal_address, side, "bench-"]
        self.processes.start(f"raw-{side}", [*argv, str(concurrency)], env)

    async def wait_http(self, port: int, name: str, timeout_s: float = 60.0) -> None:
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

    def meter(self, names: Iterable[str]) -> CpuMeter:
        assert self.processes is not None
        pids = {n: self.processes.pid(n) for n in names if n in self.processes.started}
        pids["bench"] = os.getpid()
        if self.postmaster_pid:
            pids["postgres"] = self.postmaster_pid
        if "temporal" in self.processes.started:
            pids["temporal"] = self.processes.pid("temporal")
        return CpuMeter(
            pids, with_children=("postgres", "temporal"), with_reaped=("worker-codex", "raw-worker")
        )

    def profile(self, names: Iterable[str], phase: str) -> None:
        """Attach py-spy to the named processes (with `--profile`)."""
        if self.profiler is None:
            return
        assert self.processes is not None
        self.profiler.attach({n: self.processes.pid(n) for n in names}, phase)

    def unprofile(self) -> None:
        if self.profiler is not None:
            self.profiler.detach()

    # -- run

    async def run(self) -> dict[str, Any]:
        self.started_at = time.monotonic()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.processes = Processes(self.log_dir)
        if self.config.profile:
            self.profiler = Profiler(self.out_dir / f"{self.stamp}-profile")
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
            if self.config.part in ("all", "e2e", "roundtrips"):
                self.round_trips = await measure_round_trips(self)
                for line in self.round_trips.lines():
                    self.say(f"[{self.elapsed()}] {line}")
        finally:
            self.unprofile()
            self.processes.stop_all(last=("temporal",))
            self._drop_databases()
            shutil.rmtree(tmp, ignore_errors=True)
        return self.report()

    def elapsed(self) -> str:
        return f"{time.monotonic() - self.started_at:5.0f} s"

    # -- part (a): API enqueue

    async def _api_phase(self) -> None:
        from receipts.enqueue import EnqueueRequest, enqueue
        from roles.api.settings import ApiSettings

        assert self.processes is not None
        cfg = self.config
        db_url = await self.create_database("api")
        port = self.start_api(db_url)
        await self.wait_http(port, "api")
        store = await assembly.open_store(db_url, min_size=max(cfg.api_concurrency), max_size=64)
        # Nothing drains the queue in this part: the posts go round enough organizations that
        # none holds more than half its queued cap by the end (README, Security: the API).
        posts = min(100, cfg.api_requests) + cfg.repetitions * cfg.api_requests * len(
            cfg.api_concurrency
        )
        organizations = -(-posts // (ApiSettings.model_fields["org_max_queued"].default // 2))
        raw_posts = [
            post_request(
                "127.0.0.1", port, "/agents/codex/jobs", {"payload": true_payload(f"bench-{n}")}
            )
            for n in range(organizations)
        ]
        request = EnqueueRequest(
            agent_id="codex",
            payload=dict(TRUE_PAYLOAD),
            kind="factory.task.run",
            organization_id="bench",
        )
        meter = self.meter(["api"])

        async def via_api(count: int, concurrency: int) -> Run:
            conns = [HttpConnection("127.0.0.1", port) for _ in range(concurrency)]
            free: asyncio.Queue[HttpConnection] = asyncio.Queue()
            for conn in conns:
                free.put_nowait(conn)
            failures = 0

            async def one(i: int) -> None:
                nonlocal failures
                conn = await free.get()
                try:
                    status, _body = await conn.request(raw_posts[i % organizations])
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
                # As the API enqueues a post that names no job: a made-up id, no lookup.
                made_up = dataclasses.replace(request, job_id=str(uuid.uuid4()), new_job_id=True)
                await enqueue(store, made_up)

            before = meter.snapshot()
            wall, latencies = await closed_loop(count, concurrency, one)
            after = meter.snapshot()
            cpu = CpuMeter.per_item(before, after, count, ("postgres", "bench"))
            return Run(count / wall, {"request": latencies}, cpu, count)

        try:
            # Warm both paths up (connections, imports, caches) before measuring.
            await via_api(min(100, cfg.api_requests), max(cfg.api_concurrency))
            await raw_append(min(100, cfg.api_requests), max(cfg.api_concurrency))
            self.profile(["api"], "api")
            for concurrency in cfg.api_concurrency:
                pair = Pair(
                    f"api-{concurrency}",
                    f"API enqueue, {concurrency} client{'s' if concurrency > 1 else ''}",
                )
                self.pairs[pair.name] = pair
                for rep in range(cfg.repetitions):
                    for side in order(rep, ("ours", "base")):
                        if side == "ours":
                            pair.ours.append(await via_api(cfg.api_requests, concurrency))
                        else:
                            pair.base.append(await raw_append(cfg.api_requests, concurrency))
                    self.processes.check("api")
                self.say(
                    f"[{self.elapsed()}] {pair.title}: "
                    f"{format_spread(pair.rate('ours'))} req/s vs raw append "
                    f"{format_spread(pair.rate('base'))}/s"
                )
            self.unprofile()
        finally:
            await store.close()
            self.processes.stop("api")

    # -- part (b): end to end

    async def _e2e_phase(self) -> None:
        import psycopg
        from temporalio.client import Client

        from roles.infra.settings import ProcessSettings
        from tools.bench.e2e import EndToEnd

        assert self.processes is not None
        cfg = self.config
        db_url = await self.create_database("e2e")
        concurrency = cfg.worker_concurrency or ProcessSettings().concurrency("worker-codex")
        extra = {"RECEIPT_RESONATE_EXECUTE_CONCURRENCY": str(concurrency)}
        port = self.start_api(db_url, fits=cfg.burn_jobs, **extra)
        self.start_role("driver", db_url, **extra)
        self.start_role("worker-codex", db_url, **extra)
        # The no-op job's worker: the raw worker's event loop and slots, so the two compare alike.
        self.start_role("worker-chat", db_url, **extra, RECEIPT_EVENT_LOOP="asyncio")
        self.start_raw("driver", concurrency)
        self.start_raw("worker", concurrency)
        await self.wait_http(port, "api")
        client = await Client.connect(self.temporal_address)
        db = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
        names = ("api", "driver", "worker-codex", "worker-chat", "raw-driver", "raw-worker")
        e2e = EndToEnd(self, client, db, port, self.meter(names))
        sides = ("ours", BARE, "base", SANDBOXED, CHILD)
        try:
            # Warm-up: also waits until every worker polls its task queue.
            for side in sides:
                await e2e.burn(side, cfg.warmup_jobs)
            self.profile(names, "e2e")
            burn = self._scenario("burn", f"burn-down, {cfg.burn_jobs} jobs enqueued at once")
            for rep in range(cfg.repetitions):
                for side in order(rep, sides):
                    self._runs(burn, side).append(await e2e.burn(side, cfg.burn_jobs))
                self.processes.check(*names)
            bare = self.pairs[f"burn-{BARE}"]
            self.say(
                f"[{self.elapsed()}] {burn.title}: {format_spread(burn.rate('ours'))} jobs/s "
                f"(no-op {format_spread(bare.rate('ours'))}) vs raw activity "
                f"{format_spread(burn.rate('base'))}/s, raw activity + sandbox "
                f"{format_spread(burn.rate(SANDBOXED))}/s, raw child wf "
                f"{format_spread(burn.rate(CHILD))}/s"
            )
            stream = self._scenario(
                "stream",
                f"steady stream, {format_number(cfg.stream_rate)} jobs/s for "
                f"{format_number(cfg.stream_seconds)} s",
            )
            for rep in range(cfg.repetitions):
                for side in order(rep, sides):
                    self._runs(stream, side).append(await e2e.stream(side))
                self.processes.check(*names)
            bare = self.pairs[f"stream-{BARE}"]
            self.say(
                f"[{self.elapsed()}] {stream.title}: settled p50 "
                f"{format_spread(stream.latency('ours', 'settled', 'p50'))} ms (no-op "
                f"{format_spread(bare.latency('ours', 'settled', 'p50'))} ms) vs raw activity "
                f"{format_spread(stream.latency('base', 'settled', 'p50'))} ms, raw activity + "
                f"sandbox {format_spread(stream.latency(SANDBOXED, 'settled', 'p50'))} ms, raw "
                "child wf "
                f"{format_spread(stream.latency(CHILD, 'settled', 'p50'))} ms"
            )
            self.unprofile()
            for _ in range(cfg.recoveries):  # last: it replaces the metered worker-codex
                recovery = await measure_recovery(self, db, port, db_url, extra, cfg.recovery_run_s)
                self.recoveries.append(recovery)
                self.say(
                    f"[{self.elapsed()}] recovery: worker SIGKILL → takeover "
                    f"{recovery.takeover_s:.1f} s, settled {recovery.settled_s:.1f} s "
                    f"(goal ≤ {recovery.goal_s:g} s), {recovery.settles} settle"
                )
        finally:
            await db.close()
            for name in names:
                self.processes.stop(name)

    def _scenario(self, name: str, title: str) -> Pair:
        """The scenario's pair for codex `true` and its `-bare` pair for the no-op job, which
        compares with the same raw activity and child runs."""
        pair = Pair(name, title)
        pair.runs(SANDBOXED)  # the table's columns in this order: activity, sandboxed, child
        bare = Pair(f"{name}-{BARE}", title, base=pair.base, subject=BARE_SUBJECT)
        bare.others[CHILD] = pair.runs(CHILD)
        self.pairs[pair.name] = pair
        self.pairs[bare.name] = bare
        return pair

    def _runs(self, pair: Pair, side: str) -> list[Run]:
        """Where a repetition of `side` goes: the no-op job's in the `-bare` pair."""
        return self.pairs[f"{pair.name}-{BARE}"].ours if side == BARE else pair.runs(side)

    # -- report

    def report(self) -> dict[str, Any]:
        return {
            "version": 4,  # 4: `roundTrips`; 3: the `-bare` pairs (the no-op job), `subject`
            "stamp": self.stamp,
            "config": asdict(self.config),
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "platform": platform.platform(),
            },
            "durationS": round(time.monotonic() - self.started_at, 1),
            "pairs": {name: pair.to_json() for name, pair in self.pairs.items()},
            "summary": summary(
                self.pairs,
                self.recoveries,
                self.round_trips.total[0] if self.round_trips else None,
            ),
            "profiles": self.profiles,
            "roundTrips": self.round_trips.as_dict() if self.round_trips else None,
        }
