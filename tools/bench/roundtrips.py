"""PostgreSQL round trips per no-op job, counted on the wire.

Each role of a small stack (api, driver, worker-chat) reaches the database through a loopback
proxy of its own that relays bytes unchanged and counts, per role:

* round trips — the points where the client waits for the server: the frontend's `Q` (a
  simple query) and `S` (Sync) messages, each answered by one `ReadyForQuery`. A statement on
  its own is one; a pipeline of statements (psycopg's pipeline mode) ends in one Sync and is
  one, however its bytes are split on the wire;
* statements — `Q` and `E` (Execute: one per extended-protocol statement, `BEGIN` and `COMMIT`
  included, pipelined or not) messages.

The background loops' traffic (redrive, retention, listeners) is measured first in an idle
window and subtracted at its rate over the load's window; what is left, divided by the jobs
settled, is a job's cost. No `pg_stat_statements` is needed, and nothing in the roles changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from roles.infra.ports import free_port
from tools.bench.config import NO_HANDLER_AGENT
from tools.bench.processes import role_env

if TYPE_CHECKING:
    from tools.bench.run import Bench

SSL_REQUEST = 80877103
GSS_REQUEST = 80877104


@dataclass
class Counts:
    """What one proxy saw."""

    round_trips: int = 0
    statements: int = 0
    connections: int = 0

    def minus(self, other: Counts) -> Counts:
        return Counts(
            self.round_trips - other.round_trips,
            self.statements - other.statements,
            self.connections - other.connections,
        )


@dataclass
class _Flow:
    """One connection's frontend message parser."""

    counts: Counts
    buffer: bytearray = field(default_factory=bytearray)
    started: bool = False  # past the startup message (which has no type byte)

    def client_bytes(self, data: bytes) -> None:
        self.buffer += data
        while True:
            if not self.started:
                if len(self.buffer) < 8:
                    return
                length, code = struct.unpack("!ii", self.buffer[:8])
                if len(self.buffer) < length:
                    return
                del self.buffer[:length]
                # An SSL or GSS request is answered with one byte and followed by the startup.
                self.started = code not in (SSL_REQUEST, GSS_REQUEST)
                continue
            if len(self.buffer) < 5:
                return
            kind = self.buffer[0:1]
            (length,) = struct.unpack("!i", self.buffer[1:5])
            if len(self.buffer) < 1 + length:
                return
            del self.buffer[: 1 + length]
            if kind in (b"Q", b"E"):
                self.counts.statements += 1
            if kind in (b"Q", b"S"):
                self.counts.round_trips += 1


class CountingProxy:
    """A loopback TCP relay to the PostgreSQL server of `target`, counting what crosses it."""

    def __init__(self, target_url: str) -> None:
        params = conninfo_to_dict(target_url)
        self.target_url = target_url
        self.host = str(params.get("host") or "127.0.0.1")
        self.port = int(params.get("port") or 5432)
        self.counts = Counts()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        """Listen on a free loopback port; return the database URL that goes through it."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return make_conninfo(self.target_url, host="127.0.0.1", port=port, sslmode="disable")

    def snapshot(self) -> Counts:
        return Counts(self.counts.round_trips, self.counts.statements, self.counts.connections)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.counts.connections += 1
        flow = _Flow(self.counts)
        try:
            if self.host.startswith("/"):
                up_reader, up_writer = await asyncio.open_unix_connection(
                    f"{self.host}/.s.PGSQL.{self.port}"
                )
            else:
                up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except (OSError, asyncio.CancelledError):
            # Cancelled by `close()` while connecting: end quietly, as below (a full run's
            # teardown printed the stream callback's traceback for one such connection).
            writer.close()
            self._tasks.discard(task)
            return

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, up: bool) -> None:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while data := await src.read(65536):
                    if up:
                        flow.client_bytes(data)
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(OSError):
                dst.close()

        try:
            # Cancelled by `close()`: end quietly, or the stream's callback finds a cancelled
            # handler task and logs it.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(pump(reader, up_writer, True), pump(up_reader, writer, False))
        finally:
            up_writer.close()
            writer.close()
            self._tasks.discard(task)


@dataclass
class RoundTrips:
    """Per role: round trips and statements per job, beside the idle background's rate."""

    jobs: int
    per_job: dict[str, tuple[float, float]]  # role → (round trips, statements) per job
    idle_per_s: dict[str, float]  # role → round trips per second with nothing to do

    @property
    def total(self) -> tuple[float, float]:
        return (
            sum(r for r, _ in self.per_job.values()),
            sum(s for _, s in self.per_job.values()),
        )

    def lines(self) -> list[str]:
        trips, statements = self.total
        out = [
            f"PostgreSQL round trips per no-op job: {trips:.1f} ({statements:.1f} statements), "
            f"{self.jobs} jobs, background subtracted (target ≤ 10)"
        ]
        for role, (r, s) in self.per_job.items():
            out.append(
                f"  {role:<12} {r:5.1f} round trips  {s:5.1f} statements  "
                f"(idle {self.idle_per_s[role]:.1f}/s)"
            )
        return out

    def as_dict(self) -> dict[str, object]:
        trips, statements = self.total
        return {
            "jobs": self.jobs,
            "roundTripsPerJob": round(trips, 2),
            "statementsPerJob": round(statements, 2),
            "perRole": {
                role: {"roundTrips": round(r, 2), "statements": round(s, 2)}
                for role, (r, s) in self.per_job.items()
            },
            "idleRoundTripsPerSecond": {k: round(v, 2) for k, v in self.idle_per_s.items()},
        }


ROLES = ("api", "driver", "worker-chat")


async def measure_round_trips(
    bench: Bench, jobs: int = 60, rate: float = 5.0, idle_s: float = 10.0
) -> RoundTrips:
    """No-op jobs at `rate`/s through api, driver and worker-chat, each on a counting proxy."""
    from tools.bench.e2e import EndToEnd

    assert bench.processes is not None
    db_url = await bench.create_database("roundtrips")
    proxies = {role: CountingProxy(db_url) for role in ROLES}
    urls = {role: await proxy.start() for role, proxy in proxies.items()}
    names = {role: f"rt-{role}" for role in ROLES}
    extra = {"RECEIPT_TASK_QUEUE_PREFIX": "rt-", "RECEIPT_ORG_MAX_RUNNING_PER_GROUP": "0"}
    port = 0
    try:
        for role in ROLES:
            env = dict(extra)
            if role == "api":
                port = free_port()
                env.update(
                    RECEIPT_API_PORT=str(port),
                    RECEIPT_API_HOST="127.0.0.1",
                    RECEIPT_ORG_ENQUEUE_RATE="1e9",
                    RECEIPT_ORG_ENQUEUE_BURST=str(10**9),
                    RECEIPT_ORG_REQUESTS_IN_FLIGHT=str(10**9),
                )
            if role == "worker-chat":
                env["RECEIPT_EVENT_LOOP"] = "asyncio"
            argv = [sys.executable, "-m", "roles.role", role]
            bench.processes.start(
                names[role], argv, role_env(urls[role], bench.temporal_address, env)
            )
        await bench.wait_http(port, names["api"])
        db = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
        try:
            e2e = EndToEnd(bench, None, db, port, bench.meter([]))
            warm = await e2e._enqueue_receipts(5, None, NO_HANDLER_AGENT)
            await e2e._wait_receipts(warm, 60)
            await asyncio.sleep(1.0)  # the warm-up's trailing writes
            idle_start, t0 = _snap(proxies), time.monotonic()
            await asyncio.sleep(idle_s)
            idle = _delta(_snap(proxies), idle_start)
            idle_rate = {r: c.round_trips / (time.monotonic() - t0) for r, c in idle.items()}
            idle_stmt_rate = {r: c.statements / (time.monotonic() - t0) for r, c in idle.items()}
            load_start, t1 = _snap(proxies), time.monotonic()
            job_ids = await e2e._enqueue_receipts(jobs, lambda i: i / rate, NO_HANDLER_AGENT)
            await e2e._wait_receipts(job_ids, 120)
            await asyncio.sleep(1.0)  # writes that follow a settle (ledger rows)
            window = time.monotonic() - t1
            load = _delta(_snap(proxies), load_start)
        finally:
            await db.close()
        per_job = {
            role: (
                (c.round_trips - idle_rate[role] * window) / len(job_ids),
                (c.statements - idle_stmt_rate[role] * window) / len(job_ids),
            )
            for role, c in load.items()
        }
        return RoundTrips(len(job_ids), per_job, idle_rate)
    finally:
        for name in names.values():
            bench.processes.stop(name)
        for proxy in proxies.values():
            await proxy.close()


def _snap(proxies: Mapping[str, CountingProxy]) -> dict[str, Counts]:
    return {role: proxy.snapshot() for role, proxy in proxies.items()}


def _delta(after: Mapping[str, Counts], before: Mapping[str, Counts]) -> dict[str, Counts]:
    return {role: after[role].minus(before[role]) for role in after}
