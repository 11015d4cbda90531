"""Dispatch from the workers (RECEIPT_DISPATCH_FROM_WORKERS): a starter whose drivers run on a
worker queue claims a job's first delivery in the database before starting it, so the replicas
of a worker group, which all hear the job's enqueue, start it once; a claim whose start failed
is given back. Real PostgreSQL and a real Temporal dev server."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import Client
from temporalio.service import RPCError

from activities.driver import DriverActivities
from receipts import deliveries
from receipts.kinds import QUEUE_CODEX
from receipts.store import Store
from roles.delivery.runtime import attempt_worker
from roles.delivery.starter import CLAIMED, DriverStarter
from tests.integration.delivery.conftest import Stack, running_stack, wait_for_status
from tests.integration.helpers import put, types
from workflows.driver import JobDriver

TRUE = {"task": {"command": ["true"]}}


def _worker_starter(client: Client, stack: Stack) -> DriverStarter:
    """A starter as a worker's own dispatcher has it: its drivers run on receipt-codex."""
    return DriverStarter(
        client,
        stack.store,
        stack.settings,
        stack.timing,
        plan_first_run=True,
        eager_start=True,
        driver_queue=QUEUE_CODEX,
    )


async def test_two_replicas_racing_on_each_job_start_it_once(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    # No fair share to keep: every job may start at once.
    async with running_stack(
        client,
        fresh_store,
        fresh_db,
        queues=(),
        dispatcher=False,
        RECEIPT_ORG_MAX_RUNNING_PER_GROUP="0",
    ) as stack:
        # The codex worker hosts the drivers beside the attempts, as the role does.
        driver = DriverActivities(fresh_store, stack.settings, stack.timing)
        worker = attempt_worker(
            client,
            fresh_store,
            stack.queue(QUEUE_CODEX),
            stack.handlers,
            settings=stack.handler_settings,
            workflows=[JobDriver],
            activities=[driver.prepare_delivery, driver.post_callbacks],
        )
        stack.workers[QUEUE_CODEX] = worker
        stack.tasks.append(asyncio.create_task(worker.run()))
        other = await Client.connect(client.service_client.config.target_host)
        replicas = (_worker_starter(client, stack), _worker_starter(other, stack))
        jobs = [(await put(fresh_store, payload_extra=TRUE)).job for _ in range(6)]
        outcomes = [await asyncio.gather(*(r.start(job.job_id) for r in replicas)) for job in jobs]
        finals = [await wait_for_status(fresh_store, job.job_id) for job in jobs]
    for pair in outcomes:
        assert sorted((r.created, r.reason) for r in pair) == [(False, CLAIMED), (True, None)]
    assert [f.status for f in finals] == ["completed"] * 6
    for job in jobs:
        assert await types(fresh_store, job.job_id) == [
            "job.enqueued",
            "job.leased",
            "job.heartbeat",
            "job.completed",
        ]
        latest = (await deliveries.job_and_latest(fresh_store, job.job_id))[1]
        assert latest is not None and latest.generation == 0


async def test_a_claim_whose_start_failed_is_given_back(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    async with running_stack(client, fresh_store, fresh_db, queues=(), dispatcher=False) as stack:
        # A namespace Temporal does not have: the start is refused after the claim was taken.
        lost = await Client.connect(client.service_client.config.target_host, namespace="absent")
        job = (await put(fresh_store, payload_extra=TRUE)).job
        with pytest.raises(RPCError):  # the dispatcher logs it (dispatch.failed)
            await _worker_starter(lost, stack).start(job.job_id)
        # Given back: the rescan lists the job again and another replica starts it.
        assert job.job_id in await deliveries.undelivered_queued(fresh_store)
        started = await _worker_starter(client, stack).start(job.job_id)
        assert (started.created, started.generation) == (True, 0)
