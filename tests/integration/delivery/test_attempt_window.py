"""An attempt that starts late in its driver's window (it waited for a worker; a redelivery
starts later still) and outlives it: Temporal cancels the activity when the window closes, but
the delivery still holds the job's lease, so the handler runs on to its end and settles under
the fence; the driver's next run waits for the job on its receipts. Cancelling it there left the
job leased to nobody until the lease expired, and cost it an attempt (`maxAttempts: 1`: failed).

The window is shrunk for the test (the driver's run is the lease plus a margin, 120 s at least):
every other part is real."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from temporalio.client import Client

from activities.handlers.context import HandlerContext
from receipts import metrics, timing
from receipts.store import Store
from receipts.timing import TimingSettings
from tests.integration.delivery.conftest import running_stack, wait_for_status
from tests.integration.helpers import put, types
from workflows import driver

HANDLER_S = 7.0


async def slow(ctx: HandlerContext) -> dict[str, Any]:
    await asyncio.sleep(HANDLER_S)
    return {"slept": HANDLER_S}


async def test_an_attempt_that_outlives_its_drivers_window_runs_on_and_settles_once(
    client: Client, fresh_store: Store, fresh_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The driver's run is the lease (10 s) alone; the attempt's window what is left of it less
    # 2 s (the attempt times out before the run does, as in production with 10 s).
    # Temporal hears from the attempt every 1.6 s (the worker-lost timeout of 2 s).
    monkeypatch.setattr(timing, "DRIVER_TIMEOUT_FLOOR_MS", 0)
    monkeypatch.setattr(timing, "DRIVER_TIMEOUT_MARGIN_MS", 0)
    monkeypatch.setattr(driver, "RUN_END_MARGIN", timedelta(seconds=2))
    monkeypatch.setattr(driver, "MIN_ATTEMPT_WINDOW", timedelta(seconds=1))
    detached = metrics.value("receipt_attempts_detached_total", reason="not_found")
    async with running_stack(
        client,
        fresh_store,
        fresh_db,
        queues=(),
        timing=TimingSettings(JOB_LEASE_MS=10_000),
        handlers={"slow": slow},
        RECEIPT_WORKER_LOST_TIMEOUT_MS=2_000,
    ) as stack:
        job = (await put(fresh_store, agent="slow", maxAttempts=1)).job
        await asyncio.sleep(5)  # no worker yet: 3 s of the window are left when one comes
        await stack.start_worker("receipt-chat")
        done = await wait_for_status(fresh_store, job.job_id, timeout=60)
    assert (done.status, done.attempt, done.result) == ("completed", 1, {"slept": HANDLER_S})
    assert "job.lease_expired" not in await types(fresh_store, job.job_id)
    # A worker hears of its activity's timeout as Temporal no longer knowing it.
    assert metrics.value("receipt_attempts_detached_total", reason="not_found") == detached + 1
