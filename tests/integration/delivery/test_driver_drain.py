"""A driver's drain (SIGTERM): the jobs enqueued meanwhile are the other drivers' to start."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from receipts import assembly, notices
from receipts.listen import Listener
from receipts.settings import Settings
from receipts.store import Store
from roles.delivery.serve import run_driver
from roles.infra.process import Runtime
from roles.infra.settings import ProcessSettings, RuntimeSettings
from tests.eventually import eventually
from tests.integration.delivery.receiver import Receiver
from tests.integration.helpers import put

HOLD_S = 4.0  # the answer to a `dispatched` post (within a try's 5 s): driver-a's drain


def task(*argv: str) -> dict[str, Any]:
    return {"task": {"command": list(argv)}}


@asynccontextmanager
async def driver_process(
    name: str, target: str, db_url: str, settings: RuntimeSettings
) -> AsyncIterator[tuple[asyncio.Event, asyncio.Task[None]]]:
    """`run_driver` as a driver process runs it, on a Temporal client of its own named `name`
    (its worker's identity); yields its stop event and its task. Leaving it ends its tasks
    as the process's exit would."""
    store = await assembly.open_store(db_url, min_size=2, max_size=10)
    client = await Client.connect(target, identity=name)
    listener = Listener(db_url, always=notices.ALL)
    runtime = Runtime("driver", settings, store, db_url, listener, httpx.AsyncClient(), client)
    runtime.spawn(listener.run(), "listener")
    await asyncio.wait_for(listener.connected.wait(), 10)
    stop = asyncio.Event()
    driving = asyncio.create_task(run_driver(runtime, stop))
    try:
        yield stop, driving
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(driving, return_exceptions=True), 30)
        await runtime.close()


async def started_by(client: Client, workflow_id: str) -> tuple[str, bool] | None:
    """Who started the driver (its client's identity) and whether its first workflow task went
    straight to that client's worker (eager start); None while it is not started."""
    try:
        async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
            started = event.workflow_execution_started_event_attributes
            return started.identity, started.eager_execution_accepted
    except RPCError:
        return None
    return None


async def test_jobs_enqueued_while_a_driver_drains_are_started_eagerly_by_the_other_driver(
    temporal_env: WorkflowEnvironment, fresh_db: str, fresh_store: Store
) -> None:
    """A job a draining driver's dispatcher started went through the task queue (a stopping
    worker takes no eager task), where a poll the stopping worker still had open could take its
    first workflow task and never run it: the job waited out the workflow task timeout (10 s;
    one such job of three in tests/e2e/test_shutdown.py). Now a driver starts nothing once its
    stop is set; the other driver starts the jobs, eagerly, into its own worker."""
    client = temporal_env.client
    target = client.service_client.config.target_host
    async with Receiver(hold={"dispatched": HOLD_S}) as receiver:
        core = Settings(
            RECEIPT_TASK_QUEUE_PREFIX=f"t{uuid.uuid4().hex[:8]}-",
            RECEIPT_EVENT_CALLBACK_URL=receiver.url,
            RECEIPT_ORG_MAX_RUNNING_PER_GROUP="0",  # no attempt worker settles them
        )
        settings = RuntimeSettings(core=core)
        # The other driver's teardown does not wait for the posts it holds.
        quick = RuntimeSettings(core=core, process=ProcessSettings(RECEIPT_SHUTDOWN_GRACE_MS=0))
        async with driver_process("driver-a", target, fresh_db, settings) as (stop_a, a):
            # Driver A posts a `dispatched` the receiver holds: its drain lasts as long.
            held = (await put(fresh_store, payload_extra=task("true"))).job
            await eventually(
                lambda: poster(client, held.job_id),
                lambda who: who == "driver-a",
                timeout=20,
                every=0.05,
                what="driver-a posting `dispatched`",
            )
            async with driver_process("driver-b", target, fresh_db, quick) as (_, b):
                await asyncio.sleep(1.0)  # its worker polls, its dispatcher listens
                stop_a.set()
                jobs = [(await put(fresh_store, payload_extra=task("true"))).job for _ in range(8)]
                starts = [
                    await eventually(
                        functools.partial(started_by, client, job.job_id),
                        lambda who: who is not None,
                        timeout=20,
                        what=f"job {job.job_id} started",
                    )
                    for job in jobs
                ]
                draining = not a.done()
                assert not b.done()
            await asyncio.wait_for(a, HOLD_S + 10)
    assert draining, "driver-a ended its drain before the jobs were started"
    assert starts == [("driver-b", True)] * len(jobs), starts
    bodies = [r.body for r in receiver.requests]
    assert any(held.job_id.encode() in body for body in bodies)


async def poster(client: Client, job_id: str) -> str | None:
    """The identity of the worker running the job's `post_callbacks` activity."""
    try:
        described = await client.get_workflow_handle(job_id).describe()
    except RPCError:
        return None
    for activity in described.raw_description.pending_activities:
        if activity.activity_type.name == "post_callbacks" and activity.last_worker_identity:
            return str(activity.last_worker_identity)
    return None
