"""A loop's failure series exists, at 0, from the loop's start: Prometheus' `increase()` cannot
see a series' first sample as an increase, so a series born at 1 would hide the first failure
and the alerts on it (ReceiptRetentionFailing: three in 30 minutes) would need one more."""

from __future__ import annotations

import asyncio
import contextlib

from prometheus_client import REGISTRY

from roles.delivery.loops import Ticker


async def _never() -> None:
    raise AssertionError("not ticked in this test")


async def test_a_loops_failure_series_is_exported_at_zero_from_its_start() -> None:
    name = "series-at-start"
    ticker = Ticker(name, _never, 60_000, first_delay_ms=60_000)
    task = asyncio.create_task(ticker.run())
    await asyncio.sleep(0.01)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    value = REGISTRY.get_sample_value("receipt_loop_failed_passes_total", {"loop": name})
    assert value == 0.0
