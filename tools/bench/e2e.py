"""The end-to-end scenarios: codex `true` jobs through Receipt's api, driver and worker-codex
roles, no-op jobs (an agent with no handler) through the api, driver and worker-chat roles, and
one workflow per job through each raw pipeline (tools/bench/raw.py), as a burn-down (N at once)
or a steady stream (a fixed rate). Receipt's times come from its receipts (`job.enqueued` →
`job.leased` → the terminal one), the raw pipelines' from their activity."""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from activities.handlers.context import no_handler_message
from receipts.jobs import TERMINAL_STATUSES
from receipts.sql import query
from tools.bench.config import NO_HANDLER_AGENT, TERMINAL_TYPES, TRUE_PAYLOAD, BenchError
from tools.bench.load import HttpConnection, closed_loop, post_request
from tools.bench.processes import CpuMeter
from tools.bench.raw import DRIVER_QUEUE, PIPELINES, WORKER_QUEUE
from tools.bench.results import BARE, Run

if TYPE_CHECKING:
    from tools.bench.run import Bench

Schedule = Callable[[int], float] | None
RECEIPT_PROCESSES = ("api", "driver", "worker-codex", "postgres", "temporal", "bench")
BARE_PROCESSES = ("api", "driver", "worker-chat", "postgres", "temporal", "bench")
RAW_PROCESSES = ("raw-driver", "raw-worker", "temporal", "bench")


@dataclass
class EndToEnd:
    """Runs one scenario on one side: `ours` (Receipt, codex `true`), `bare` (Receipt, the no-op
    job) or a raw pipeline (`base`, `sandboxed`, `child`)."""

    bench: Bench
    client: Any
    db: Any  # a psycopg AsyncConnection (autocommit) on the run's database
    port: int
    meter: CpuMeter

    async def burn(self, side: str, count: int) -> Run:
        """`count` jobs enqueued at once."""
        return await self._run(side, count, None)

    async def stream(self, side: str) -> Run:
        """The configured rate for the configured seconds."""
        cfg = self.bench.config
        count = max(1, round(cfg.stream_rate * cfg.stream_seconds))
        return await self._run(side, count, lambda i: i / cfg.stream_rate)

    async def _run(self, side: str, count: int, schedule: Schedule) -> Run:
        if side == "ours":
            return await self._receipt_run(count, schedule, "codex", RECEIPT_PROCESSES)
        if side == BARE:
            return await self._receipt_run(count, schedule, NO_HANDLER_AGENT, BARE_PROCESSES)
        return await self._raw_run(PIPELINES[side], count, schedule)

    # -- Receipt

    def _post(self, agent_id: str) -> bytes:
        path = f"/agents/{agent_id}/jobs"
        return post_request("127.0.0.1", self.port, path, {"payload": TRUE_PAYLOAD})

    async def _enqueue_receipts(self, count: int, schedule: Schedule, agent_id: str) -> list[str]:
        """POST `count` jobs: as fast as 16 clients go, or each at `schedule(i)` s from now."""
        job_ids: list[str | None] = [None] * count
        conns: asyncio.Queue[HttpConnection] = asyncio.Queue()
        for _ in range(self.bench.config.enqueue_concurrency):
            conns.put_nowait(HttpConnection("127.0.0.1", self.port))
        raw = self._post(agent_id)
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
            cur = await self.db.execute(
                query("tooling_terminal_count"),
                {"job_ids": list(job_ids), "statuses": list(TERMINAL_STATUSES)},
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

    async def _receipt_times(
        self, job_ids: Sequence[str], expected: str
    ) -> tuple[dict[str, list[float]], int]:
        """From the chain: enqueue→leased and enqueue→terminal (ms) of the settled jobs, and
        how many of them ended other than with the `expected` terminal receipt."""
        cur = await self.db.execute(
            query("tooling_job_milestones"),
            {
                "streams": [f"jobs/{j}" for j in job_ids],
                "types": ["job.enqueued", "job.leased", *TERMINAL_TYPES],
            },
        )
        rows = await cur.fetchall()
        firsts: dict[tuple[str, str], float] = {}
        failed = 0
        for stream, type_, at in rows:
            kind = "terminal" if type_ in TERMINAL_TYPES else type_
            if kind == "terminal" and (stream, kind) not in firsts and type_ != expected:
                failed += 1
            firsts.setdefault((stream, kind), at)
        settled = [s for s, kind in firsts if kind == "terminal" and (s, "job.enqueued") in firsts]
        times = timeline(
            (firsts[(s, "job.enqueued")], firsts.get((s, "job.leased")), firsts[(s, "terminal")])
            for s in settled
        )
        return times, failed

    async def _receipt_run(
        self, count: int, schedule: Schedule, agent_id: str, processes: Sequence[str]
    ) -> Run:
        open_before = await self._running()
        before = self.meter.snapshot()
        job_ids = await self._enqueue_receipts(count, schedule, agent_id)
        unsettled = await self._wait_receipts(job_ids, run_timeout(count))
        await self._quiesce(open_before)
        after = self.meter.snapshot()
        # The no-op job ends `job.failed` (no handler), not retried: that is its settle; one
        # that failed for another reason is a failure.
        expected = "job.failed" if agent_id == NO_HANDLER_AGENT else "job.completed"
        times, failed = await self._receipt_times(job_ids, expected)
        if agent_id == NO_HANDLER_AGENT:
            failed += await self._other_errors(job_ids, no_handler_message(agent_id))
        return self._result(times, count, failed, unsettled, before, after, processes)

    async def _other_errors(self, job_ids: Sequence[str], error: str) -> int:
        cur = await self.db.execute(
            query("tooling_other_errors"), {"job_ids": list(job_ids), "error": error}
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0

    # -- the raw pipelines

    async def _start_raw(self, workflow: str, count: int, schedule: Schedule) -> list[Any]:
        prefix = f"raw-{uuid.uuid4().hex[:8]}"
        started_at: list[tuple[str, float]] = [("", 0.0)] * count
        t0 = time.perf_counter()

        async def one(i: int) -> None:
            if schedule is not None:
                await asyncio.sleep(max(0.0, t0 + schedule(i) - time.perf_counter()))
            workflow_id = f"{prefix}-{i}"
            enqueued = time.time()
            await self.client.start_workflow(
                workflow,
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

    async def _raw_run(self, workflow: str, count: int, schedule: Schedule) -> Run:
        open_before = await self._running()
        before = self.meter.snapshot()
        started = await self._start_raw(workflow, count, schedule)
        await self._quiesce(open_before, run_timeout(count))
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
        unsettled = count - len(settled)
        return self._result(timeline(settled), count, 0, unsettled, before, after, RAW_PROCESSES)

    # -- both

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

    def _result(
        self,
        times: dict[str, list[float]],
        count: int,
        failed: int,
        unsettled: int,
        before: Mapping[str, float],
        after: Mapping[str, float],
        processes: Iterable[str],
    ) -> Run:
        span = times.pop("span")[0]
        cpu = CpuMeter.per_item(before, after, count, processes)
        settled = len(times["settled"])
        return Run(settled / span if span > 0 else 0.0, times, cpu, count, failed, unsettled)


def run_timeout(count: int) -> float:
    """How long a run of `count` jobs may take before its stragglers are left out."""
    return max(60.0, count * 0.5)


def timeline(rows: Iterable[tuple[float, float | None, float]]) -> dict[str, list[float]]:
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
