"""The process's probe of Temporal (activities/attempt_reach.py)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from temporalio.client import Client

from activities.attempt_reach import PROBE_S, TemporalReach


class Temporal:
    """A client whose `workflow_service.get_system_info` answers and counts."""

    def __init__(self) -> None:
        self.probes = 0
        self.workflow_service = self

    async def get_system_info(self, request: Any, **_: Any) -> None:
        self.probes += 1


async def test_a_watch_begun_as_the_last_one_ends_is_still_probed() -> None:
    """One attempt's watch ending (the probe cancelled) as another's begins, in one step of the
    event loop: the new watch is probed (a cancelled probe not yet ended is not reused), so
    Temporal's answers keep `answered_at` fresh and no attempt reads its job for nothing."""
    temporal = Temporal()
    reach = TemporalReach(cast(Client, temporal))
    with reach.watched():
        await asyncio.sleep(1.5 * PROBE_S)
    answered, probes = reach.answered_at, temporal.probes
    with reach.watched():
        await asyncio.sleep(2.5 * PROBE_S)
    assert answered > 0 and probes == 2
    assert reach.answered_at > answered and temporal.probes >= probes + 2, temporal.probes
