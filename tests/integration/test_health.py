"""roles/infra/health.py against a real PostgreSQL and a real Temporal dev server: /readyz is 200
only while this client's worker polls its task queue (workflow and activity) and the pool
reaches the database; /healthz follows the event loop; /metrics and the ready gauge are served."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.sandbox_policy import SandboxSettings
from receipts import assembly
from receipts.store import Store
from roles.infra import health
from roles.infra.health import HealthChecker, HealthState, sandbox_check, serve_health
from tests.eventually import eventually


@workflow.defn(name="HealthProbeWorkflow")
class HealthProbeWorkflow:
    @workflow.run
    async def run(self) -> None:
        return None


@activity.defn(name="health_probe")
async def health_probe() -> None:
    return None


def get(port: int, path: str) -> tuple[int, dict[str, Any] | str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            status, body = response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read().decode()
    return status, json.loads(body) if body.startswith("{") else body


async def until_ready(checker: HealthChecker, timeout: float = 30) -> list[str]:
    """The checker's reasons once there are none (AssertionError with the last after
    `timeout`)."""
    return await eventually(
        checker.check_once, lambda reasons: not reasons, timeout=timeout, every=0.2, what="ready"
    )


async def test_ready_only_while_the_worker_polls_and_not_while_draining(
    temporal_env: Any, store: Store
) -> None:
    client = temporal_env.client
    queue = f"health-{uuid.uuid4().hex[:8]}"
    stop = asyncio.Event()
    checker = HealthChecker(store, client, [queue], stop)
    server = serve_health("127.0.0.1", 0, checker.state)
    assert server is not None
    port = server.server_port
    try:
        reasons = await checker.check_once()
        assert any(f"no workflow poll from {client.identity} on {queue}" in r for r in reasons)
        assert any(f"no activity poll from {client.identity} on {queue}" in r for r in reasons)
        checker.state.update(reasons)
        status, body = await asyncio.to_thread(get, port, "/readyz")
        assert status == 503 and isinstance(body, dict) and body["reasons"] == reasons

        worker = Worker(
            client,
            task_queue=queue,
            workflows=[HealthProbeWorkflow],
            activities=[health_probe],
            workflow_runner=UnsandboxedWorkflowRunner(),
        )
        async with worker:
            assert await until_ready(checker) == []
            checker.state.update([])
            assert await asyncio.to_thread(get, port, "/readyz") == (200, {"status": "ready"})
            metrics = (await asyncio.to_thread(get, port, "/metrics"))[1]
            assert "receipt_role_ready 1.0" in str(metrics)
            # SIGTERM: the role drains, and stops taking traffic before its worker is gone.
            stop.set()
            reasons = await checker.check_once()
            assert reasons == ["draining: the role is shutting down"]
            checker.state.update(reasons)
            assert (await asyncio.to_thread(get, port, "/readyz"))[0] == 503
            assert "receipt_role_ready 0.0" in str(
                (await asyncio.to_thread(get, port, "/metrics"))[1]
            )
    finally:
        server.shutdown()
        server.server_close()


async def test_a_database_it_cannot_reach_makes_it_unready(db_url: str, temporal_env: Any) -> None:
    store = await assembly.open_store(db_url, min_size=1, max_size=1)
    await store.close()
    checker = HealthChecker(store, None, [], asyncio.Event())
    reasons = await checker.check_once()
    assert len(reasons) == 1 and reasons[0].startswith("database unreachable: ")


async def test_healthz_turns_503_when_the_event_loop_stops_checking() -> None:
    state = HealthState()
    server = serve_health("127.0.0.1", 0, state)
    assert server is not None
    try:
        assert await asyncio.to_thread(get, server.server_port, "/healthz") == (
            200,
            {"status": "ok"},
        )
        with state.lock:
            state.last_tick -= health.LIVENESS_TIMEOUT_S + 1
        assert await asyncio.to_thread(get, server.server_port, "/healthz") == (
            503,
            {"status": "stalled"},
        )
        assert (await asyncio.to_thread(get, server.server_port, "/nope"))[0] == 404
    finally:
        server.shutdown()
        server.server_close()


def test_a_taken_port_is_logged_not_fatal() -> None:
    first = serve_health("127.0.0.1", 0, HealthState())
    assert first is not None
    try:
        assert serve_health("127.0.0.1", first.server_port, HealthState()) is None
    finally:
        first.shutdown()
        first.server_close()


async def test_a_worker_that_would_refuse_every_command_is_not_ready(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    def checker(mode: str) -> HealthChecker:
        check = sandbox_check(SandboxSettings(mode=mode))
        return HealthChecker(store, None, [], asyncio.Event(), extra_checks=[check])

    reasons = await checker("chroot").check_once()
    assert reasons == ["sandbox: RECEIPT_CODEX_SANDBOX must be one of bwrap, none, got 'chroot'"]
    assert await checker("none").check_once() == []


@pytest.mark.parametrize("skew_s", [health.POLL_FRESH_S + 30, -(health.POLL_FRESH_S + 30)])
async def test_a_clock_off_temporal_s_neither_holds_a_polling_worker_unready_nor_a_gone_one_ready(
    temporal_env: Any, store: Store, monkeypatch: pytest.MonkeyPatch, skew_s: float
) -> None:
    """Temporal stamps a poll with its own clock: this process's clock minutes fast of it does
    not make a worker that polls unready (every poll looking old), nor minutes slow keep a
    worker that stopped polling ready (its last poll looking new) past POLL_FRESH_S."""
    real, later = time.time, [0.0]  # `later`: how far both clocks moved on (none yet)

    class Skewed:
        @staticmethod
        def monotonic() -> float:
            return time.monotonic() + later[0]

        @staticmethod
        def time() -> float:
            return real() + skew_s + later[0]

    monkeypatch.setattr(health, "time", Skewed)
    client = temporal_env.client
    queue = f"health-skew-{uuid.uuid4().hex[:8]}"
    checker = HealthChecker(store, client, [queue], asyncio.Event())
    worker = Worker(
        client,
        task_queue=queue,
        workflows=[HealthProbeWorkflow],
        activities=[health_probe],
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    async with worker:
        assert await until_ready(checker, timeout=15) == []
    # Its worker gone, the poll's stamp stays: once POLL_FRESH_S passed, the role is not ready.
    later[0] = health.POLL_FRESH_S + 1
    reasons = await checker.check_once()
    assert any(f"no workflow poll from {client.identity} on {queue}" in r for r in reasons)
