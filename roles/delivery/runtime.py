"""Builders for the Temporal workers of each role (used by the role processes and the tests)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import httpx
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.attempt import AttemptActivities
from activities.attempt_reach import HEARTBEAT_THROTTLE
from activities.driver import DriverActivities
from activities.gateway import Gateway
from activities.handlers.context import Handler, HandlerSettings
from receipts.kinds import QUEUE_DRIVER
from receipts.listen import Listener
from receipts.settings import Settings
from receipts.store import Store
from receipts.timing import TimingSettings
from workflows.attempt import JobAttemptWorkflow
from workflows.driver import JobDriver, JobDriverWorkflow

DEFAULT_GRACE = timedelta(seconds=30)
# The workflows run without the SDK's sandbox: it re-imports and re-executes the workflow
# module for every run, a fifth of the driver's CPU per job in `make bench` (e2e throughput
# 0.72 → 0.75 of the raw pipeline). The sandbox's guard against non-determinism is kept where
# it catches mistakes, in the tests: tests/integration/delivery/test_replay.py replays real
# histories of every workflow under the sandboxed runner.
WORKFLOW_RUNNER = UnsandboxedWorkflowRunner()


def attempt_worker(
    client: Client,
    store: Store,
    task_queue: str,
    handlers: Mapping[str, Handler],
    *,
    settings: HandlerSettings | None = None,
    role: str = "worker",
    listener: Listener | None = None,
    concurrency: int = 16,
    graceful_shutdown: timedelta = DEFAULT_GRACE,
    workflows: Sequence[type] = (),
    activities: Sequence[Callable[..., Any]] = (),
    gateway: Gateway | None = None,
) -> Worker:
    """A worker for one of receipt-chat/codex/control: the attempt activity (plus any
    role-specific `workflows`/`activities`, e.g. the watchdog tick). It also registers
    `JobAttemptWorkflow`, so attempt children started by an older driver drain."""
    attempt = AttemptActivities(
        store, handlers, settings=settings, role=role, listener=listener, gateway=gateway
    )
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[JobAttemptWorkflow, *workflows],
        activities=[attempt.execute_attempt, *activities],
        max_concurrent_activities=concurrency,
        graceful_shutdown_timeout=graceful_shutdown,
        workflow_runner=WORKFLOW_RUNNER,
        # Every attempt heartbeat is sent: a worker cut off stops its handler before a
        # redelivery's starts only if Temporal's last beat is that recent (attempt_reach).
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
    )


def driver_worker(
    client: Client,
    store: Store,
    settings: Settings,
    timing: TimingSettings,
    http: httpx.AsyncClient | None = None,
    graceful_shutdown: timedelta = timedelta(0),
) -> Worker:
    """A worker for receipt-driver: the driver workflow, job reads and callbacks. At its
    shutdown a callback post in flight gets `graceful_shutdown` to be answered: cut at once,
    its receiver heard it twice (the retry's post) or a terminal one waited for the recovery
    loop."""
    activities = DriverActivities(store, settings, timing, http)
    return Worker(
        client,
        task_queue=settings.queue(QUEUE_DRIVER),
        workflows=[JobDriver, JobDriverWorkflow],
        activities=[
            activities.prepare_delivery,
            activities.post_callbacks,
        ],
        graceful_shutdown_timeout=graceful_shutdown,
        workflow_runner=WORKFLOW_RUNNER,
    )
