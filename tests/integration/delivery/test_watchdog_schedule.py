"""The watchdog's Temporal Schedule (J50, J52): `RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_ENABLED=0`
creates it paused, and turning the watchdog back on unpauses the same Schedule."""

from __future__ import annotations

import uuid

from temporalio.client import Client

from receipts.objectives.watchdog import WatchdogSettings
from receipts.settings import Settings
from roles.delivery.watchdog_schedule import ensure_watchdog_schedule


async def test_enabled_0_creates_the_schedule_paused_and_1_resumes_it(client: Client) -> None:
    settings = Settings(RECEIPT_TASK_QUEUE_PREFIX=f"w{uuid.uuid4().hex[:8]}-")
    off = WatchdogSettings.load({"RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_ENABLED": "0"})
    sid = await ensure_watchdog_schedule(client, settings, off)
    handle = client.get_schedule_handle(sid)
    try:
        paused = await handle.describe()
        assert paused.schedule.state.paused
        assert "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_ENABLED=0" in (paused.schedule.state.note or "")
        # The server keeps the cron as a calendar: every minute.
        assert paused.schedule.spec.calendars or paused.schedule.spec.cron_expressions
        on = WatchdogSettings.load({})
        assert await ensure_watchdog_schedule(client, settings, on) == sid  # the same one
        assert not (await handle.describe()).schedule.state.paused
    finally:
        await handle.delete()
