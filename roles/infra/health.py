"""A role's HTTP endpoint beside its work: `/metrics`, `/healthz` (liveness), `/readyz` (readiness).

Every role but the api (which serves all three itself) runs one. The answers come from a
checker task on the role's event loop, so they say what the role can do, not only that a
thread answers:

- `/healthz` is 200 while the event loop ran the checker within `LIVENESS_TIMEOUT_S`; a wedged
  loop (a blocking call, a deadlock) turns it 503 and Kubernetes restarts the pod.
- `/readyz` is 200 only while the pool reaches PostgreSQL (`SELECT 1` within
  `CHECK_TIMEOUT_S`), the role is not draining, and, for a role that runs a Temporal worker,
  Temporal lists this process (its client identity) among the pollers of each of its task
  queues (workflow and activity) with a poll within `POLL_FRESH_S` (Temporal stamps a poll with
  its clock, which this host's may be minutes off: a poll is new when its stamp changed, timed
  on this process's monotonic clock), and, for a role that runs
  commands, the command sandbox can confine them here (`sandbox_check`). Anything else is 503
  with a JSON body naming the failed check.

A readiness change is logged (`health.ready` / `health.unready` with the reasons) and exported
as the gauge `receipt_role_ready`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from temporalio.api.enums.v1 import TaskQueueKind, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

# Every role serves every family, the layers' too (declared beside them: docs/design.md §8).
import receipts.agent_jobs.metrics
import receipts.objectives.metrics  # noqa: F401
from activities import sandbox
from receipts import metrics
from receipts.store import Store
from receipts.waits import within
from roles.infra.process import Runtime

log = logging.getLogger("roles.infra.health")

CHECK_INTERVAL_S = 5.0
CHECK_TIMEOUT_S = 3.0
LIVENESS_TIMEOUT_S = 30.0
# A worker long-polls for up to ~70 s on an idle queue and Temporal stamps `last_access_time`
# when a poll starts, so an idle but healthy worker's poll can be that old.
POLL_FRESH_S = 120.0
POLLED_TYPES = (TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)


@dataclass
class HealthState:
    """What the HTTP thread reports; written by the checker on the event loop."""

    last_tick: float = field(default_factory=time.monotonic)
    ready: bool = False
    reasons: list[str] = field(default_factory=lambda: ["starting"])
    lock: threading.Lock = field(default_factory=threading.Lock)

    def live(self, now: float | None = None) -> bool:
        with self.lock:
            return (now or time.monotonic()) - self.last_tick < LIVENESS_TIMEOUT_S

    def snapshot(self) -> tuple[bool, list[str]]:
        with self.lock:
            return self.ready, list(self.reasons)

    def update(self, reasons: list[str]) -> None:
        with self.lock:
            was = self.ready
            self.last_tick = time.monotonic()
            self.ready = not reasons
            self.reasons = reasons
        metrics.ROLE_READY.set(1 if not reasons else 0)
        if was and reasons:
            log.warning(
                "role not ready: %s",
                "; ".join(reasons),
                extra={"event": "health.unready", "reasons": reasons},
            )
        elif not was and not reasons:
            log.info("role ready", extra={"event": "health.ready"})


@dataclass
class HealthChecker:
    """Checks the database and the Temporal pollers every `CHECK_INTERVAL_S`."""

    store: Store
    client: Client | None
    task_queues: Sequence[str]
    stop: asyncio.Event
    state: HealthState = field(default_factory=HealthState)
    # Further checks: each returns why the role is not ready, or None.
    extra_checks: Sequence[Callable[[], Awaitable[str | None]]] = ()
    # (task queue, type) -> the stamp of this process's last poll Temporal listed, and when
    # (time.monotonic()) it was first seen.
    polls: dict[tuple[str, int], tuple[int, float]] = field(default_factory=dict)

    async def check_once(self) -> list[str]:
        """Return the reasons the role is not ready (empty when it is)."""
        if self.stop.is_set():
            return ["draining: the role is shutting down"]
        reasons: list[str] = []
        try:
            await within(self._ping_database(), CHECK_TIMEOUT_S)
        except Exception as exc:
            reasons.append(f"database unreachable: {type(exc).__name__}: {exc}".rstrip(": "))
        if self.task_queues and self.client is not None:
            try:
                reasons += await within(self._missing_pollers(), CHECK_TIMEOUT_S)
            except Exception as exc:
                metrics.DEPENDENCY_REACHABLE.labels("temporal").set(0)
                reasons.append(f"temporal unreachable: {type(exc).__name__}: {exc}".rstrip(": "))
            else:
                metrics.DEPENDENCY_REACHABLE.labels("temporal").set(1)
        for check in self.extra_checks:
            reason = await check()
            if reason:
                reasons.append(reason)
        return reasons

    async def run(self) -> None:
        """Re-check until cancelled, and at once when `stop` is set: /readyz is 503 from the
        drain's first moment, not up to `CHECK_INTERVAL_S` later (a drain is often shorter)."""
        while True:
            self.state.update(await self.check_once())
            if self.stop.is_set():
                await asyncio.sleep(CHECK_INTERVAL_S)  # still live while it drains
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), CHECK_INTERVAL_S)

    async def _ping_database(self) -> None:
        await self.store.ping()

    async def _missing_pollers(self) -> list[str]:
        assert self.client is not None
        identity = self.client.identity
        missing: list[str] = []
        for queue in self.task_queues:
            for queue_type in POLLED_TYPES:
                response = await self.client.workflow_service.describe_task_queue(
                    DescribeTaskQueueRequest(
                        namespace=self.client.namespace,
                        task_queue=TaskQueue(name=queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
                        task_queue_type=queue_type,
                    )
                )
                stamps = [
                    poller.last_access_time.ToNanoseconds()
                    for poller in response.pollers
                    if poller.identity == identity
                ]
                if not self._polled_lately((queue, queue_type), max(stamps, default=None)):
                    kind = TaskQueueType.Name(queue_type).removeprefix("TASK_QUEUE_TYPE_").lower()
                    missing.append(f"temporal: no {kind} poll from {identity} on {queue}")
        return missing

    def _polled_lately(self, key: tuple[str, int], stamp: int | None) -> bool:
        """Whether this process polled within POLL_FRESH_S: the stamp Temporal lists (its clock)
        changed since this process's monotonic clock says that long ago. Compared with this
        host's wall clock, a clock minutes fast made every poll look old (never ready), one
        minutes slow a worker gone look fresh."""
        now = time.monotonic()
        if stamp is None:
            self.polls.pop(key, None)
            return False
        seen = self.polls.get(key)
        if seen is None or seen[0] != stamp:
            self.polls[key] = (stamp, now)
            return True
        return now - seen[1] < POLL_FRESH_S


def sandbox_check(settings: sandbox.SandboxSettings) -> Callable[[], Awaitable[str | None]]:
    """The check of why commands cannot run here (bwrap unable to build its namespaces: a pod
    without user namespaces), or None. A worker that would refuse every command is not ready,
    so a rollout onto such nodes stalls instead of failing jobs."""

    async def reason() -> str | None:
        ok, message = await sandbox.probe(settings)
        return None if ok else f"sandbox: {message}"

    return reason


def _fixed(reason: str) -> Callable[[], Awaitable[str | None]]:
    async def check() -> str | None:
        return reason

    return check


def _handler(state: HealthState | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
            elif state is None:  # metrics only: the api answers its health on its own port
                self._json(404, {"error": "not found: /metrics"})
            elif path == "/healthz":
                live = state.live()
                self._json(200 if live else 503, {"status": "ok" if live else "stalled"})
            elif path == "/readyz":
                ready, reasons = state.snapshot()
                body: dict[str, Any] = {"status": "ready" if ready else "unready"}
                if reasons:
                    body["reasons"] = reasons
                self._json(200 if ready else 503, body)
            else:
                self._json(404, {"error": "not found: /metrics, /healthz, /readyz"})

        def _json(self, status: int, body: dict[str, Any]) -> None:
            self._send(status, json.dumps(body).encode(), "application/json")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            """Probes every few seconds would flood the log; errors show in the answers."""

    return Handler


def serve_health(host: str, port: int, state: HealthState | None) -> ThreadingHTTPServer | None:
    """Serve /metrics, /healthz and /readyz on a daemon thread; a taken port is logged. Without
    a `state`, /metrics alone: the api's scrape port when RECEIPT_METRICS_PORT is set (its own
    /metrics, on the API's port, needs an admin token, which a scraper should not hold)."""
    try:
        server = ThreadingHTTPServer((host, port), _handler(state))
    except OSError as exc:
        log.warning(
            "metrics and health endpoint disabled: %s:%s is taken (set RECEIPT_METRICS_PORT)",
            host,
            port,
            extra={"event": "metrics.unavailable", "port": port, "error": str(exc)},
        )
        return None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="health-http", daemon=True).start()
    log.info(
        "metrics on http://%s:%s/metrics%s",
        host,
        server.server_port,
        "" if state is None else " (and /healthz, /readyz)",
        extra={"event": "metrics.listening", "port": server.server_port},
    )
    return server


def serve_role_health(
    runtime: Runtime,
    task_queues: Sequence[str],
    stop: asyncio.Event,
    *,
    sandboxed: bool,
    handler_failures: Sequence[str] = (),
) -> None:
    """Serve the role's endpoint on its metrics port and run its checker: ready while the pool
    reaches PostgreSQL and Temporal sees this process poll `task_queues` (and, when `sandboxed`,
    while the sandbox can confine commands here), never while an installed handler failed to
    load (`handler_failures`)."""
    queues = [runtime.settings.core.queue(q) for q in task_queues]
    extra = [sandbox_check(runtime.settings.sandbox)] if sandboxed else []
    if handler_failures:
        extra.append(_fixed(f"handlers: {'; '.join(handler_failures)}"))
    checker = HealthChecker(runtime.store, runtime.client, queues, stop, extra_checks=extra)
    process = runtime.settings.process
    serve_health(process.metrics_host, process.metrics_port_of(runtime.role), checker.state)
    runtime.spawn(checker.run(), "health")
