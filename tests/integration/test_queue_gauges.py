"""The gauges worker-control refreshes from the projection: the oldest queued job's age by lane and
worker group, read with the database clock, for deliverable jobs only, back to 0 once the queue
drains."""

from __future__ import annotations

from receipts import metrics
from receipts import operations as ops
from receipts.jobs import LANES
from receipts.store import Store
from roles.infra.metrics import OTHER_GROUP, refresh_queue_depth
from tests.eventually import eventually
from tests.integration.helpers import put


def oldest(lane: str, group: str) -> float:
    return metrics.value("receipt_queue_oldest_age_seconds", lane=lane, group=group)


async def test_the_oldest_queued_age_by_lane_and_group(fresh: tuple[Store, str]) -> None:
    store, _ = fresh
    waiting = (await put(store, lane="collect", payload_extra={"task": {"command": ["true"]}})).job
    # A delayed job is queued but not late: it must not count as waiting.
    await put(store, "nobody-listens", lane="chat", delayMs=600_000)

    async def refreshed() -> float:
        await refresh_queue_depth(store)
        return oldest("collect", "codex")

    age = await eventually(refreshed, lambda s: s >= 1.0, timeout=20, what="a second of waiting")
    assert age < 20  # the job's own age, not an epoch or a history-wide minimum
    assert oldest("chat", "chat") == 0.0
    # Every lane and group has its series (0 where nothing waits), so an alert sees a drain.
    for lane in LANES:
        for group in ("chat", "codex", "control", OTHER_GROUP):
            assert (
                metrics.REGISTRY.get_sample_value(
                    "receipt_queue_oldest_age_seconds", {"lane": lane, "group": group}
                )
                is not None
            ), (lane, group)
    assert metrics.value("receipt_queue_depth", status="queued") == 2.0

    await ops.cancel_queued(store, waiting.job_id, reason="test")
    await refresh_queue_depth(store)
    assert oldest("collect", "codex") == 0.0
