"""The gauges worker-control reads from the database: the queue's depth by status, the age of the
oldest queued job by lane and worker group, and the jobs held back for a dispatch slot of their
organization. Every family is declared in
receipts/metrics.py; a role serves them on its metrics port (roles/infra/health.py)."""

from __future__ import annotations

import asyncio
import logging

from receipts import fairness, metrics, reads
from receipts.errors import ReceiptError
from receipts.jobs import ACTIVE_STATUSES, LANES, STATUSES
from receipts.kinds import GROUP_QUEUES
from receipts.settings import Settings
from receipts.store import Store

ACTIVE_ORDER = tuple(s for s in STATUSES if s in ACTIVE_STATUSES)
# The `group` label of a worker queue: its group's name; a queue no group names (a row written
# before jobs were routed) is `other`, so the label keeps a fixed set of values.
GROUP_OF_QUEUE = {queue: group for group, queue in GROUP_QUEUES.items()}
OTHER_GROUP = "other"
QUEUE_DEPTH_INTERVAL_S = 5.0
QUEUE_DEPTH_LOOP = "queue_depth"

log = logging.getLogger("roles.infra.metrics")


async def refresh_queue_depth(store: Store, settings: Settings | None = None) -> None:
    """Read active job counts by status and the oldest queued job's age by lane and group from
    the projection into their gauges (partial indexes: the cost follows the active jobs, not the
    history), and with `settings` how many of the queued ones wait for a dispatch slot."""
    counts = await reads.active_by_status(store)
    for status in ACTIVE_ORDER:
        metrics.QUEUE_DEPTH.labels(status).set(counts.get(status, 0))
    await refresh_oldest_age(store, queued=counts.get("queued", 0))
    if settings is None:
        return
    if counts.get("queued") and fairness.capped(settings):
        metrics.WAITING_FOR_SLOT.set(await fairness.held_back(store, settings))
    else:
        metrics.WAITING_FOR_SLOT.set(0)


async def refresh_oldest_age(store: Store, queued: int) -> None:
    """Set the oldest-queued-age gauge of every lane and worker group: the database's answer,
    0 where nothing waits (every series exists, so an alert sees a queue drain). With nothing
    `queued` (the depth just read) there is nothing to ask."""
    ages = await reads.queued_oldest_age(store) if queued else {}
    oldest: dict[tuple[str, str], float] = {}
    for (lane, queue), age in ages.items():
        key = (lane, GROUP_OF_QUEUE.get(queue or "", OTHER_GROUP))
        oldest[key] = max(age, oldest.get(key, 0.0))
    for lane in LANES:
        for group in (*GROUP_QUEUES, OTHER_GROUP):
            metrics.QUEUE_OLDEST_AGE.labels(lane, group).set(oldest.get((lane, group), 0.0))


async def run_queue_depth(
    store: Store, settings: Settings, interval_s: float = QUEUE_DEPTH_INTERVAL_S
) -> None:
    """Refresh the queue-depth gauges until cancelled. A failed read waits for the next, and
    is logged (`loop.failed`) and counted (`receipt_loop_failed_passes{loop="queue_depth"}`):
    its gauges keep their last values meanwhile, and the queue alerts read them."""
    metrics.LOOP_FAILED.labels(QUEUE_DEPTH_LOOP)  # from 0: an alert's increase() sees the first
    while True:
        try:
            await refresh_queue_depth(store, settings)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the gauges must outlive any one failing read
            metrics.LOOP_FAILED.labels(QUEUE_DEPTH_LOOP).inc()
            log.warning(
                "queue-depth refresh failed; the gauges keep their last values",
                exc_info=not isinstance(exc, ReceiptError),
                extra={"event": "loop.failed", "loop": QUEUE_DEPTH_LOOP, "error": str(exc)},
            )
        await asyncio.sleep(interval_s)
