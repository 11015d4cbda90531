"""The bench's history part: how enqueue and the periodic queries fare with N finished jobs.

Runs against a fresh database on the server of `--database-url` (default
RECEIPT_DATABASE_URL, else the embedded server), dropped at the end:

1. two databases, "empty" and "loaded", each get a template job run through the real operations
   (enqueue, lease + heartbeat, heartbeat, progress, complete: six receipts) and `--active`
   queued and as many running jobs; the loaded one also gets `--jobs` finished jobs cloned from
   its template by one INSERT … SELECT generate_series (receipts/sql/tooling.sql); VACUUM ANALYZE;
2. every periodic query's execution time on each (median of three warm EXPLAIN ANALYZE runs);
3. enqueue at 1 and 8 connections, in `--seconds` slices alternating between the databases;
4. the heartbeat updates' HOT share on the loaded database; a table of the ratios and targets.

    python -m tools.bench.history --jobs 100000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from receipts import assembly, fairness, retention
from receipts import operations as ops
from receipts.enqueue import enqueue, parse_enqueue
from receipts.settings import DEFAULT_ORG_RUNNING_CAPS, Settings
from receipts.sql import query
from receipts.store import Store
from roles.infra.db import migrate_url

ORG = "org-history"
LEASE_MS = 600_000

# Every query a loop or gauge runs on a timer, with the parameters it runs with, and the API list
# filters that used to walk an organization's history. `objective_streams` is the Factory's
# (replaced by its objectives table in that branch); it is measured while it exists.
# The default shares of fair dispatch (RECEIPT_ORG_MAX_RUNNING_PER_GROUP).
CAPS: dict[str, Any] = fairness.caps(
    Settings(RECEIPT_ORG_MAX_RUNNING_PER_GROUP=DEFAULT_ORG_RUNNING_CAPS)
)
# A retention pass's first batch (receipts/retention.py `Resume`): from the start of each order.
PASS_START: dict[str, Any] = {
    "batch": 1_000,
    "after_updated_at": retention.START[0],
    "after_job_id": retention.START[1],
}
# The first page of the dispatcher's rescan and the redrive (receipts/deliveries.py `Cursor`).
START: dict[str, Any] = {"after_created_at": None, "after_job_id": None}
PERIODIC: dict[str, tuple[str, dict[str, Any]]] = {
    "jobs_by_status (queue-depth gauge, 5 s)": ("jobs_by_status", {}),
    "callbacks_owed (callback recovery, 15 s)": (
        "callbacks_owed",
        {"limit": 200, "scan": 1000, "urls": ["https://a.example/cb"], "dispatched_wait_s": 90},
    ),
    "expired_leases (lease expiry, 15 s)": ("expired_leases", {"limit": 200}),
    "redrive_candidates (queued redrive, 15 s)": (
        "redrive_candidates",
        {"min_age_ms": 30_000, "cooldown_ms": 15_000, "limit": 200, "page": 1_000, **START, **CAPS},
    ),
    "undelivered_queued (dispatcher rescan)": (
        "undelivered_queued",
        {"limit": 500, "page": 500, **START, **CAPS},
    ),
    "next_available_at (dispatcher)": ("next_available_at", {}),
    "dispatch_held_back (queue-depth gauge, 5 s)": ("dispatch_held_back", CAPS),
    "dispatch_freed (dispatcher, each settled job)": (
        "dispatch_freed",
        {"job_id": "history-0", **CAPS},
    ),
    "prune_victims, nothing due (retention, 60 s)": ("prune_victims", PASS_START),
    "prune_agent_victims (retention, 60 s)": (
        "prune_agent_victims",
        {**PASS_START, "callback_urls": ["https://callbacks.example/hook"]},
    ),
    "prune_objective_victims (retention, 60 s)": ("prune_objective_victims", PASS_START),
    "objective_streams limit 200 (Factory outbox, 5 s)": ("objective_streams", {"limit": 200}),
    "objectives_audit_lost (Factory outbox, 5 s)": ("objectives_audit_lost", {"limit": 50}),
}
ENQUEUE_VARIANTS: tuple[tuple[str, int, bool], ...] = (
    ("enqueue 1 client", 1, False),
    ("enqueue 8 clients", 8, False),
    ("enqueue 1 client, jobId + sessionKey", 1, True),
)
LISTS: dict[str, dict[str, Any]] = {
    "api_list_jobs org, lane=steer": {"lane": "steer"},
    "api_list_jobs org, status=queued": {"status": "queued"},
    "api_list_jobs org, first page": {},
}


def list_params(**filters: Any) -> dict[str, Any]:
    """api_list_jobs parameters for one organization's first page of 50."""
    params: dict[str, Any] = {
        "all_organizations": False,
        "caller_organization_id": ORG,
        "organization_id": None,
        "status": None,
        "agent_id": None,
        "lane": None,
        "session_key": None,
        "kind": None,
        "before_created_at": None,
        "before_job_id": None,
        "limit": 50,
    }
    params.update(filters)
    return params


def enqueue_body(session_key: str | None = None, job_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "payload": {
            "kind": "factory.task.run",
            "authContext": {"userId": "u-1", "organizationId": ORG},
            "command": ["true"],
        }
    }
    if session_key:
        body["sessionKey"] = session_key
    if job_id:
        body["jobId"] = job_id
    return body


async def run_template(store: Store) -> str:
    """One finished job through the real operations; its rows are what the preload clones."""
    job = (await enqueue(store, parse_enqueue("codex", enqueue_body()))).job
    worker = f"{job.job_id}:attempt:1/1"
    await ops.start_attempt(store, job.job_id, attempt=1, worker_id=worker, lease_ms=LEASE_MS)
    await ops.heartbeat(store, job.job_id, worker_id=worker, attempt=1, lease_ms=LEASE_MS)
    await ops.progress(store, job.job_id, worker_id=worker, attempt=1, data={"line": "ok"})
    await ops.complete(store, job.job_id, worker_id=worker, attempt=1, result={"exitCode": 0})
    return job.job_id


async def add_active(store: Store, count: int) -> list[tuple[str, str]]:
    """`count` queued jobs and `count` running ones; returns the running (jobId, workerId)."""
    running: list[tuple[str, str]] = []
    for i in range(2 * count):
        job = (await enqueue(store, parse_enqueue("codex", enqueue_body()))).job
        if i % 2:
            worker = f"{job.job_id}:attempt:1/1"
            await ops.start_attempt(
                store, job.job_id, attempt=1, worker_id=worker, lease_ms=LEASE_MS
            )
            running.append((job.job_id, worker))
    return running


async def preload(
    store: Store, template_id: str, count: int, *, age_s: float = 0.0, spacing_s: float = 0.001
) -> None:
    """Clone the template as `count` finished jobs `<template>-<n>` in one statement."""
    async with store.connection() as conn:
        await conn.execute(
            query("preload_finished_jobs"),
            {
                "template_id": template_id,
                "prefix": f"{template_id}-",
                "count": count,
                "age_s": age_s,
                "spacing_s": spacing_s,
            },
        )


async def enqueue_rate(store: Store, clients: int, seconds: float, *, keyed: bool = False) -> float:
    """Enqueues per second over `seconds` with `clients` concurrent callers."""
    deadline = time.monotonic() + seconds
    done = 0

    async def client() -> None:
        nonlocal done
        while time.monotonic() < deadline:
            body = (
                enqueue_body(session_key=uuid.uuid4().hex, job_id=uuid.uuid4().hex)
                if keyed
                else enqueue_body()
            )
            await enqueue(store, parse_enqueue("codex", body))
            done += 1

    started = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    return done / (time.monotonic() - started)


async def query_ms(
    conn: psycopg.AsyncConnection[Any], name: str, params: Mapping[str, Any]
) -> float:
    """Median execution time of three warm EXPLAIN ANALYZE runs (after one warm-up)."""
    times: list[float] = []
    for _ in range(4):
        cur = await conn.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + query(name).encode(), params)
        row = await cur.fetchone()
        assert row is not None
        times.append(float(row[0][0]["Execution Time"]))
    return statistics.median(times[1:])


async def measure_queries(url: str, cutoff_age: timedelta) -> dict[str, float]:
    """Every periodic query's median execution time (ms)."""
    out: dict[str, float] = {}
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(query("session_settings"), {"names": ["jit"], "values": ["off"]})
        cur = await conn.execute(
            query("retention_cutoff"), {"older_than_s": cutoff_age.total_seconds()}
        )
        row = await cur.fetchone()
        assert row is not None
        cutoff = row[0]
        for label, (name, params) in PERIODIC.items():
            try:
                query(name)
            except KeyError:
                continue
            out[label] = await query_ms(conn, name, {"cutoff": cutoff, **params})
        for label, filters in LISTS.items():
            out[label] = await query_ms(conn, "api_list_jobs", list_params(**filters))
    return out


async def heartbeat_hot_share(
    url: str, store: Store, running: list[tuple[str, str]], rounds: int
) -> dict[str, Any]:
    """Heartbeat every running job `rounds` times; the share of those updates that were HOT."""

    async def stats() -> dict[str, tuple[int, int]]:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            cur = await conn.execute(query("table_update_stats"), {})
            return {r[0]: (int(r[1]), int(r[2])) for r in await cur.fetchall()}

    before = await stats()
    beats = 0
    for _ in range(rounds):
        for job_id, worker in running:
            out = await ops.heartbeat(store, job_id, worker_id=worker, attempt=1, lease_ms=LEASE_MS)
            beats += out.ok
    # A backend reports its table counters when it exits (or when idle, rate-limited): close the
    # pool so every heartbeat's update is counted.
    await store.close()
    await asyncio.sleep(0.5)
    after = await stats()
    upd = sum(after[t][0] - before.get(t, (0, 0))[0] for t in after)
    hot = sum(after[t][1] - before.get(t, (0, 0))[1] for t in after)
    return {
        "heartbeats": beats,
        "updates": upd,
        "hot": hot,
        "hotShare": hot / upd if upd else None,
        "byTable": {
            t: [after[t][0] - before.get(t, (0, 0))[0], after[t][1] - before.get(t, (0, 0))[1]]
            for t in after
        },
    }


@dataclass
class HistoryResult:
    jobs: int
    empty: dict[str, float] = field(default_factory=dict)
    loaded: dict[str, float] = field(default_factory=dict)
    preload_s: float = 0.0
    database_mb: float = 0.0
    hot: dict[str, Any] = field(default_factory=dict)
    enqueue_ratio: dict[str, float] = field(default_factory=dict)

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(measure, empty, loaded, loaded/empty) rows."""
        out = []
        for label, empty in self.empty.items():
            loaded = self.loaded.get(label, float("nan"))
            unit = "/s" if label.startswith("enqueue") else " ms"
            ratio = self.enqueue_ratio.get(label, loaded / empty if empty else float("nan"))
            out.append((label, f"{empty:.2f}{unit}", f"{loaded:.2f}{unit}", f"{ratio:.2f}×"))
        return out

    def longest_periodic(
        self, which: Mapping[str, float], *, factory: bool = True
    ) -> tuple[str, float]:
        periodic = {
            k: v
            for k, v in which.items()
            if not k.startswith("enqueue") and (factory or "Factory" not in k)
        }
        label = max(periodic, key=lambda k: periodic[k])
        return label, periodic[label]

    def render(self) -> str:
        lines = [
            f"History part: {self.jobs:,} finished jobs (6 receipts each) preloaded in "
            f"{self.preload_s:.1f} s; database {self.database_mb:,.0f} MB after the load. Enqueue: "
            "median of paired slices (ratio: median of the pairs' ratios); queries: median of "
            "three warm EXPLAIN ANALYZE runs.",
            "",
            "| measure | empty | loaded | loaded / empty |",
            "|---|---|---|---|",
        ]
        lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in self.rows()]
        e_label, e_ms = self.longest_periodic(self.empty)
        l_label, l_ms = self.longest_periodic(self.loaded)
        ratio = l_ms / e_ms if e_ms else float("nan")
        lines += [
            "",
            f"Longest periodic query: empty {e_ms:.2f} ms ({e_label}); loaded {l_ms:.2f} ms "
            f"({l_label}); ratio {ratio:.2f}×.",
        ]
        if self.hot:
            share = self.hot["hotShare"]
            lines.append(
                f"Heartbeats: {self.hot['heartbeats']} → {self.hot['updates']} row updates, "
                f"{self.hot['hot']} HOT ({share:.0%}); per table (updates, HOT): "
                f"{json.dumps(self.hot['byTable'])}."
                if share is not None
                else f"Heartbeats: {self.hot['heartbeats']}, no row updates counted."
            )
        lines += ["", "Targets:"]
        for label in ("enqueue 1 client", "enqueue 8 clients"):
            if label in self.empty:
                r = self.enqueue_ratio.get(label, self.loaded[label] / self.empty[label])
                lines.append(
                    f"- {label}: {r:.2f}× the empty rate (target ≥ 0.90×): "
                    f"{'met' if r >= 0.9 else 'MISSED'}"
                )
        lines.append(
            f"- every periodic query ≤ 10 ms loaded: longest {l_ms:.2f} ms ({l_label}): "
            f"{'met' if l_ms <= 10 else 'MISSED'}"
        )
        if "Factory" in l_label:
            o_label, o_ms = self.longest_periodic(self.loaded, factory=False)
            lines.append(
                f"  (without the Factory's objective_streams prefix scan, which its objectives "
                f"table replaces: longest {o_ms:.2f} ms ({o_label}): "
                f"{'met' if o_ms <= 10 else 'MISSED'})"
            )
        if self.hot and self.hot["hotShare"] is not None:
            lines.append(
                f"- heartbeat updates HOT ≥ 90 %: {self.hot['hotShare']:.0%}: "
                f"{'met' if self.hot['hotShare'] >= 0.9 else 'MISSED'}"
            )
        return "\n".join(lines)


def _named(statement: str, database: str) -> sql.Composed:
    """A tooling statement with `{name}` filled in as a quoted identifier."""
    return sql.SQL(statement).format(name=sql.Identifier(database))


async def _database(admin_url: str, name: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(_named(query("tooling_create_database"), name))
    url = make_conninfo(admin_url, dbname=name)
    await migrate_url(url)
    return url


async def run(
    admin_url: str, jobs: int, active: int, seconds: float, rounds: int, reps: int = 6
) -> HistoryResult:
    """Two databases with the same active work, one also holding `jobs` finished jobs."""
    suffix = uuid.uuid4().hex[:8]
    names = {"empty": f"receipt_bench_history_empty_{suffix}"}
    names["loaded"] = f"receipt_bench_history_loaded_{suffix}"
    result = HistoryResult(jobs)
    stores: dict[str, Store] = {}
    try:
        urls = {k: await _database(admin_url, n) for k, n in names.items()}
        running: dict[str, list[tuple[str, str]]] = {}
        for key, url in urls.items():
            stores[key] = await assembly.open_store(url, min_size=2, max_size=10)
            template = await run_template(stores[key])
            running[key] = await add_active(stores[key], active)
            if key == "loaded":
                started = time.monotonic()
                await preload(stores[key], template, jobs, age_s=3600.0)
                result.preload_s = time.monotonic() - started
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(query("tooling_vacuum_analyze").encode())
                row = conn.execute(query("database_size").encode()).fetchone()
                if key == "loaded":
                    result.database_mb = (row[0] if row else 0) / 1e6
        # The periodic queries first, against exactly the active work above (the enqueue
        # measurement below adds thousands of queued jobs to both databases).
        for key, into in (("empty", result.empty), ("loaded", result.loaded)):
            into.update(await measure_queries(urls[key], timedelta(days=30)))
        # Enqueue: short slices on each database in turn (ABBA order), so the machine's drift
        # (other processes, checkpoints) hits both; the ratio is the median of the pairs'.
        for label, clients, keyed in ENQUEUE_VARIANTS:
            pairs: list[tuple[float, float]] = []
            for rep in range(reps):
                order = ("empty", "loaded") if rep % 2 == 0 else ("loaded", "empty")
                rate = {}
                for key in order:
                    rate[key] = await enqueue_rate(stores[key], clients, seconds, keyed=keyed)
                pairs.append((rate["empty"], rate["loaded"]))
            result.empty[label] = statistics.median(p[0] for p in pairs)
            result.loaded[label] = statistics.median(p[1] for p in pairs)
            result.enqueue_ratio[label] = statistics.median(p[1] / p[0] for p in pairs)
        result.hot = await heartbeat_hot_share(
            urls["loaded"], stores["loaded"], running["loaded"], rounds
        )
    finally:
        for store in stores.values():
            await store.close()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            for name in names.values():
                conn.execute(_named(query("tooling_drop_database"), name))
    return result


def main(argv: list[str] | None = None) -> int:
    from roles.infra.settings import load_or_exit

    parser = argparse.ArgumentParser(prog="python -m tools.bench.history", description=__doc__)
    parser.add_argument("--jobs", type=int, default=1_000_000, help="finished jobs to preload")
    parser.add_argument("--active", type=int, default=2000, help="queued and running jobs each")
    parser.add_argument("--seconds", type=float, default=1.5, help="per enqueue slice")
    parser.add_argument("--rounds", type=int, default=5, help="heartbeats per running job")
    core = load_or_exit().core  # this process's environment, read once
    parser.add_argument("--database-url", default=core.database_url)
    parser.add_argument("--reps", type=int, default=6, help="enqueue slices per database")
    parser.add_argument("--json", action="store_true", help="print the result as JSON too")
    args = parser.parse_args(argv)
    admin_url = args.database_url
    if not admin_url:
        from roles.infra.embedded import embedded_database_url

        admin_url = embedded_database_url(core.data_dir)
    result = asyncio.run(
        run(admin_url, args.jobs, args.active, args.seconds, args.rounds, args.reps)
    )
    print(result.render())
    if args.json:
        print(json.dumps(result.__dict__, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
