"""Dependency outages with real role processes (the loss of a connection, the SDK's and the
pool's retries, the LISTEN reconnect and the recovery loops only happen across processes):
each role reaches Temporal or PostgreSQL through a loopback proxy the test cuts and restores."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from receipts.jobs import TERMINAL_STATUSES, Job
from receipts.store import Store
from receipts.tenancy import scoped_id
from roles.infra.health import CHECK_INTERVAL_S, CHECK_TIMEOUT_S
from roles.infra.ports import free_port
from tests.cut_proxy import CutProxy
from tests.e2e.conftest import task
from tests.e2e.roles_harness import RoleProcesses, wait_for
from tests.eventually import eventually
from tests.integration.api_support import AS_A, TOKENS, enqueue_body, wait_healthz
from tests.integration.helpers import put

pytestmark = pytest.mark.e2e

SETTLES = {"job.completed", "job.failed", "job.canceled"}


async def settles_of(store: Store, job_id: str) -> list[str]:
    return [r.type for r in await store.read_stream(f"jobs/{job_id}") if r.type in SETTLES]


async def all_terminal(store: Store, job_ids: list[str], timeout_s: float) -> float:
    """Wait until every job is terminal; the seconds it took."""
    began = time.monotonic()
    while True:
        jobs = [await store.get_job(j) for j in job_ids]
        if all(j is not None and j.status in TERMINAL_STATUSES for j in jobs):
            return time.monotonic() - began
        if time.monotonic() - began > timeout_s:
            waiting = [
                (j.job_id, j.status) for j in jobs if j and j.status not in TERMINAL_STATUSES
            ]
            raise AssertionError(f"not settled in {timeout_s} s: {waiting}")
        await asyncio.sleep(0.2)


def job_body() -> dict[str, Any]:
    return enqueue_body("org-a", jobId=f"o-{uuid.uuid4().hex[:10]}", payload_extra=task("true"))


async def enqueue(api: httpx.AsyncClient, *argv: str) -> str:
    body = enqueue_body("org-a", jobId=f"o-{uuid.uuid4().hex[:10]}", payload_extra=task(*argv))
    answer = await api.post("/agents/codex/jobs", json=body, headers=AS_A)
    assert answer.status_code == 202, answer.text
    return scoped_id("org-a", answer.json()["async"]["jobId"])


def dependencies_reachable(exposition: str) -> dict[str, float]:
    """`receipt_dependency_reachable` by dependency, from a role's /metrics."""
    return {
        sample.labels["dependency"]: sample.value
        for family in text_string_to_metric_families(exposition)
        if family.name == "receipt_dependency_reachable"
        for sample in family.samples
    }


def metrics_ports(procs: RoleProcesses, *names: str) -> dict[str, int]:
    ports = {}
    for name in names:
        (listening,) = procs.logged(name, {"metrics.listening"})
        ports[name] = int(str(listening["port"]))
    return ports


async def test_a_temporal_outage_loses_no_job_and_the_backlog_starts_when_it_returns(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses], temporal_env: Any
) -> None:
    """Temporal away for 22 s: the api accepts, the jobs running settle, the starts the
    dispatcher made meanwhile fail (the SDK gives up after ~15 s). When Temporal is back the
    jobs start in seconds, not at the redrive's next look (30 s after their last receipt)."""
    store, _ = e2e_store
    host, port = temporal_env.client.service_client.config.target_host.rsplit(":", 1)
    proxy = CutProxy(host, int(port))
    await proxy.start()
    api_port = free_port()
    procs = roles(address=proxy.address, RECEIPT_API_PORT=str(api_port), RECEIPT_API_TOKENS=TOKENS)
    for role in ("api", "driver", "worker-codex"):
        procs.start(role)
    url = f"http://127.0.0.1:{api_port}"
    try:
        await asyncio.to_thread(wait_healthz, url)
        async with httpx.AsyncClient(base_url=url, timeout=30) as api:
            warm = await enqueue(api, "true")
            await all_terminal(store, [warm], 60)
            ports = metrics_ports(procs, "driver", "worker-codex")
            running = [await enqueue(api, "sleep", "4") for _ in range(2)]
            await asyncio.sleep(1.5)
            await proxy.cut()
            cut_at = time.monotonic()
            await asyncio.sleep(2)
            during = [await enqueue(api, "true") for _ in range(4)]
            await asyncio.sleep(10)
            ready = {"api": (await api.get("/readyz")).status_code}
            reachable = {}
            for name, metrics_port in ports.items():
                answer = await api.get(f"http://127.0.0.1:{metrics_port}/readyz")
                ready[name] = answer.status_code
                exposition = (await api.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
                reachable[name] = dependencies_reachable(exposition)
            await asyncio.sleep(max(0.0, 22 - (time.monotonic() - cut_at)))
            await proxy.restore()
            took = await all_terminal(store, running + during, 120)
            print(f"/readyz during the outage: {ready}; settled {took:.1f} s after it")
        for job_id in [warm, *running, *during]:
            assert len(await settles_of(store, job_id)) == 1, job_id
        assert ready == {"api": 200, "driver": 503, "worker-codex": 503}, ready
        # The gauge names the cause (ReceiptTemporalUnreachable), not only the readiness.
        both = {"database": 1.0, "temporal": 0.0}
        assert reachable == {"driver": both, "worker-codex": both}, reachable
        # 1.0-3.5 s measured (9.6-11.5 s before: the redrive's next look), here on a loaded machine
        assert took < 8, f"the backlog waited {took:.1f} s after Temporal returned"
    except BaseException:
        print(procs.logs())
        raise
    finally:
        await proxy.cut()


async def test_a_postgres_outage_is_503_then_every_job_settles_once(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses]
) -> None:
    """PostgreSQL away from the roles for 15 s (the test still reaches it): the api answers 503
    with Retry-After, the running jobs' heartbeats and settles wait it out, the LISTEN connection
    reattaches and the dispatcher's rescan starts the jobs whose wake-ups were lost."""
    store, db_url = e2e_store
    info = conninfo_to_dict(db_url)
    proxy = CutProxy(str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432))
    await proxy.start()
    proxied = make_conninfo(db_url, host="127.0.0.1", port=proxy.port)
    api_port = free_port()
    procs = roles(RECEIPT_API_PORT=str(api_port), RECEIPT_API_TOKENS=TOKENS)
    procs.env["RECEIPT_DATABASE_URL"] = proxied
    for role in ("api", "driver", "worker-codex"):
        procs.start(role)
    url = f"http://127.0.0.1:{api_port}"
    try:
        await asyncio.to_thread(wait_healthz, url)
        async with httpx.AsyncClient(base_url=url, timeout=30) as api:
            warm = await enqueue(api, "true")
            await all_terminal(store, [warm], 60)
            running = [await enqueue(api, "sleep", "3") for _ in range(2)]
            await asyncio.sleep(1.5)
            await proxy.cut()
            cut_at = time.monotonic()
            await asyncio.sleep(1)
            asked = time.monotonic()
            refused = await api.post("/agents/codex/jobs", json=job_body(), headers=AS_A)
            refused_in = time.monotonic() - asked
            ports = metrics_ports(procs, "driver", "worker-codex")

            async def probed() -> dict[str, int]:
                probes = {
                    "api /readyz": (await api.get("/readyz")).status_code,
                    "api /healthz": (await api.get("/healthz")).status_code,
                }
                for name, metrics_port in ports.items():
                    for probe in ("readyz", "healthz"):
                        answer = await api.get(f"http://127.0.0.1:{metrics_port}/{probe}")
                        probes[f"{name} /{probe}"] = answer.status_code
                return probes

            # A role's readiness is checked every 5 s (roles/infra/health.py CHECK_INTERVAL_S,
            # each check bounded by CHECK_TIMEOUT_S): the 503 came 1 s into the outage.
            probes = await eventually(
                probed,
                lambda seen: all(v == 503 for k, v in seen.items() if k.endswith("/readyz")),
                timeout=CHECK_INTERVAL_S + CHECK_TIMEOUT_S + 2,
                every=0.5,
                what="every role unready",
            )
            # Enqueued behind the roles' back: their NOTIFY is lost with the LISTEN connection.
            during = [(await put(store, org="org-a", payload_extra=task("true"))).job.job_id]
            await asyncio.sleep(max(0.0, 20 - (time.monotonic() - cut_at)))
            await proxy.restore()
            restored_at = time.monotonic()
            for _ in range(120):
                if not (
                    await api.post("/agents/codex/jobs", json=job_body(), headers=AS_A)
                ).is_error:
                    break
                await asyncio.sleep(0.5)
            back = time.monotonic() - restored_at
            settled = back + await all_terminal(store, running, 60)
            # The LISTEN connection reattaches on its backoff (1 s doubling to 30 s, J37), cut
            # short when the pool reconnects: the job enqueued meanwhile waits for that
            # reattach's rescan (11.2 s after a 20 s outage, on the backoff alone).
            rescanned = time.monotonic() - restored_at + await all_terminal(store, during, 60)
            print(
                f"during the outage: {refused.status_code} in {refused_in:.1f} s "
                f"{dict(refused.headers)} {probes}; "
                f"202 again {back:.1f} s, the running jobs settled {settled:.1f} s, the job "
                f"enqueued meanwhile {rescanned:.1f} s after it"
            )
        for job_id in [warm, *running, *during]:
            assert len(await settles_of(store, job_id)) == 1, job_id
        assert refused.status_code == 503 and refused.headers.get("Retry-After"), refused.text
        # Not after the pool's 10 s wait: the api's pool waits UNREACHABLE_WAIT_S once its
        # attempt to connect has failed.
        assert refused_in < 4, f"the 503 took {refused_in:.1f} s"
        # Not ready (no new traffic), still live (no restart of a role that only waits).
        assert probes == {
            "api /readyz": 503,
            "api /healthz": 200,
            "driver /readyz": 503,
            "driver /healthz": 200,
            "worker-codex /readyz": 503,
            "worker-codex /healthz": 200,
        }, probes
        assert back < 5, f"the api answered 503 for {back:.1f} s after PostgreSQL returned"
        assert settled < 6, f"the running jobs settled {settled:.1f} s after PostgreSQL returned"
        assert rescanned < 8, f"the job enqueued meanwhile started {rescanned:.1f} s after"
    except BaseException:
        print(procs.logs())
        raise
    finally:
        await proxy.cut()


# Each run of the handler ticks into its workspace (one per job, shared by its attempts) every
# 0.2 s, named by its start time; a later run than the first ticks for 2 s only.
TICKER = (
    "me=$(date +%s%N); n=150; [ -e ticks ] && n=10; i=0; "
    'while [ $i -lt $n ]; do echo "$me $(date +%s%N)" >> ticks; sleep 0.2; i=$((i+1)); done'
)


def ticks_of(job_id: str) -> str:
    root = Path(os.environ["RECEIPT_WORKSPACE_ROOT"])
    (ticks,) = root.glob(f"orgs/*/jobs/*{job_id.split('~')[0]}*/ticks")
    return ticks.read_text()


def assert_one_handler_at_a_time(ticks: str) -> None:
    """Each run of the handler (its ticks, named by its start) ended before the next began."""
    runs: dict[str, list[int]] = {}
    for line in ticks.split("\n"):
        if line.strip():
            run, at = line.split()
            runs.setdefault(run, []).append(int(at))
    spans = sorted((min(t) / 1e9, max(t) / 1e9) for t in runs.values())
    print(f"handler runs (s): {[(round(a % 1000, 1), round(b % 1000, 1)) for a, b in spans]}")
    for (_, first_end), (second_start, _) in itertools.pairwise(spans):
        assert first_end < second_start, spans


async def ticking_beside_a_standby(store: Store, procs: RoleProcesses) -> Job:
    """A ticker job running on worker-codex-1 with worker-codex-2 started beside it, 3 s in."""
    job = (await put(store, org="org-a", payload_extra=task("sh", "-c", TICKER))).job
    held = await wait_for(store, job.job_id, ("running",), 60)
    assert held.lease is not None
    procs.start("worker-codex-2", "worker-codex")
    await asyncio.sleep(3)
    return job


async def test_a_worker_cut_from_postgres_past_its_lease_stops_its_handler_before_a_takeover(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses]
) -> None:
    """A worker that can reach Temporal but not PostgreSQL for 25 s, its lease 10 s: its
    heartbeats cannot be written, the lease expires, another worker stands by. The handler is
    stopped at its execution timeout (the lease less 1 s from its start, so before any expiry of
    a lease it renewed), and the next run starts only after the lease expired and a redrive
    delivered it: two runs of the handler never tick at once, and the job settles once."""
    store, db_url = e2e_store
    info = conninfo_to_dict(db_url)
    proxy = CutProxy(str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432))
    await proxy.start()
    procs = roles(
        CODEX_JOB_LEASE_MS="10000",
        JOB_LEASE_MS="10000",
        RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS="2000",
        RECEIPT_RESONATE_QUEUED_REDRIVE_MIN_AGE_MS="2000",
        RECEIPT_RESONATE_QUEUED_REDRIVE_COOLDOWN_MS="2000",
    )
    procs.start("driver")
    direct = procs.env["RECEIPT_DATABASE_URL"]
    procs.env["RECEIPT_DATABASE_URL"] = make_conninfo(db_url, host="127.0.0.1", port=proxy.port)
    procs.start("worker-codex-1", "worker-codex")
    procs.env["RECEIPT_DATABASE_URL"] = direct
    try:
        job = await ticking_beside_a_standby(store, procs)
        await proxy.cut()
        await asyncio.sleep(25)
        await proxy.restore()
        done = await wait_for(store, job.job_id, tuple(TERMINAL_STATUSES), 90)
        assert_one_handler_at_a_time(await asyncio.to_thread(ticks_of, job.job_id))
        assert len(await settles_of(store, job.job_id)) == 1, done
    except BaseException:
        print(procs.logs())
        raise
    finally:
        await proxy.cut()


async def test_a_temporal_outage_past_the_heartbeat_timeout_never_runs_two_handlers_at_once(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses], temporal_env: Any
) -> None:
    """Temporal away for 35 s from the worker running a job (Temporal's heartbeat timeout 30 s):
    Temporal times the attempt out and delivers it again when the worker is back. The first run
    is stopped before the second one starts: both ran at once for 1-2.2 s (the start fence took
    the live lease over and the handler ran at once; the first delivery looked for a takeover
    every 2 s only once Temporal's cancellation reached it). Now its watcher hears the
    takeover's notice, and the new delivery starts its handler TAKEOVER_GRACE_S later."""
    store, _ = e2e_store
    host, port = temporal_env.client.service_client.config.target_host.rsplit(":", 1)
    proxy = CutProxy(host, int(port))
    await proxy.start()
    procs = roles(address=proxy.address)
    procs.start("driver")
    procs.start("worker-codex")
    try:
        ticker = TICKER.replace("n=150", "n=250")
        job = (await put(store, org="org-a", payload_extra=task("sh", "-c", ticker))).job
        await wait_for(store, job.job_id, ("running",), 60)
        await asyncio.sleep(2)
        await proxy.cut()
        await asyncio.sleep(35)
        await proxy.restore()
        await wait_for(store, job.job_id, tuple(TERMINAL_STATUSES), 90)
        assert_one_handler_at_a_time(await asyncio.to_thread(ticks_of, job.job_id))
        assert len(await settles_of(store, job.job_id)) == 1
    except BaseException:
        print(procs.logs())
        raise
    finally:
        await proxy.cut()


async def test_a_worker_cut_from_postgres_and_temporal_stops_its_handler_before_a_takeover(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses], temporal_env: Any
) -> None:
    """A worker cut from PostgreSQL and Temporal at once for 15 s, its lease 120 s, Temporal's
    heartbeat timeout 6 s: Temporal redelivers the attempt to the other worker, which takes the
    lease over and runs the handler. The cut worker hears no notice (its LISTEN connection is
    cut too) and writes no heartbeat (a lease cadence is 40 s): its handler ran on until
    PostgreSQL came back, 9.0 s past the start of the takeover's, whose whole 1.8 s run ticked
    beside it. Now it stops its handler once Temporal has not answered it for longer than a
    redelivery could wait and its job cannot be read (`activities/attempt_reach.py`): 2.3-2.4 s
    after the cut, the takeover's handler starting 7.5-7.6 s after it."""
    store, db_url = e2e_store
    info = conninfo_to_dict(db_url)
    pg = CutProxy(str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432))
    await pg.start()
    host, port = temporal_env.client.service_client.config.target_host.rsplit(":", 1)
    temporal = CutProxy(host, int(port))
    await temporal.start()
    procs = roles(
        CODEX_JOB_LEASE_MS="120000",
        JOB_LEASE_MS="120000",
        RECEIPT_WORKER_LOST_TIMEOUT_MS="6000",
    )
    procs.start("driver")
    direct = dict(procs.env)
    procs.env["RECEIPT_DATABASE_URL"] = make_conninfo(db_url, host="127.0.0.1", port=pg.port)
    procs.env["RECEIPT_TEMPORAL_ADDRESS"] = temporal.address
    procs.start("worker-codex-1", "worker-codex")
    procs.env = direct
    try:
        job = await ticking_beside_a_standby(store, procs)
        await asyncio.gather(pg.cut(), temporal.cut())
        print(f"both cut at {time.time() % 1000:.1f}")
        await asyncio.sleep(15)
        await asyncio.gather(pg.restore(), temporal.restore())
        done = await wait_for(store, job.job_id, tuple(TERMINAL_STATUSES), 90)
        assert_one_handler_at_a_time(await asyncio.to_thread(ticks_of, job.job_id))
        assert len(await settles_of(store, job.job_id)) == 1, done
        (stopped,) = procs.logged("worker-codex-1", {"attempt.cut_off"})
        assert stopped["outcome"] == "unreadable", stopped
    except BaseException:
        print(procs.logs())
        raise
    finally:
        await pg.cut()
        await temporal.cut()
