"""The dispatcher: wakes on `job.enqueued` notices and hands each new job to the driver starter."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime

from receipts import deliveries
from receipts.jobs import job_id_of
from receipts.listen import RECONNECTED, Listener, Notice
from receipts.store import Store
from roles.delivery.starter import DriverStarter

log = logging.getLogger("roles.delivery.dispatcher")

MAX_IDLE_S = 60.0


class Dispatcher:
    """Enqueue never talks to Temporal: the receipt is the outbox, and this is its reader.

    After every (re)attach of the LISTEN connection it rescans for deliverable queued jobs that
    were never dispatched, so a wake-up lost while reconnecting is not a lost job. Jobs enqueued
    with a delay are dispatched when the database clock reaches their `availableAt`.
    """

    def __init__(
        self, store: Store, listener: Listener, starter: DriverStarter, concurrency: int = 32
    ) -> None:
        self.store = store
        self.listener = listener
        self.starter = starter
        self._slots = asyncio.Semaphore(concurrency)
        self._tasks: set[asyncio.Task[None]] = set()

    async def run_once(self) -> int:
        """Dispatch every deliverable queued job that has never been dispatched; return the count."""
        job_ids = await deliveries.undelivered_queued(self.store)
        await asyncio.gather(*(self._dispatch(job_id) for job_id in job_ids))
        return len(job_ids)

    async def _dispatch(self, job_id: str) -> None:
        async with self._slots:
            try:
                await self.starter.start(job_id)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one job's failure must not stop the others
                # The redrive loop and the next rescan pick the job up again.
                log.warning(
                    "dispatch failed",
                    extra={"event": "dispatch.failed", "jobId": job_id, "error": str(exc)},
                )

    def _spawn(self, job_id: str) -> None:
        task = asyncio.create_task(self._dispatch(job_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _timeout(self) -> float:
        soonest: datetime | None = await deliveries.next_available_at(self.store)
        if soonest is None:
            return MAX_IDLE_S
        delay = (soonest - await self.store.now()).total_seconds()
        return min(MAX_IDLE_S, max(0.05, delay))

    async def run(self) -> None:
        """Dispatch until cancelled."""
        async with self.listener.subscribe() as queue:
            try:
                await self.run_once()
                timeout = await self._timeout()
                while True:
                    notice: Notice | None = None
                    with contextlib.suppress(TimeoutError):
                        notice = await asyncio.wait_for(queue.get(), timeout)
                    try:
                        if notice is None or notice is RECONNECTED:
                            await self.run_once()
                            timeout = await self._timeout()
                        elif "job.enqueued" in notice.types:
                            self._spawn(job_id_of(notice.stream))
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:  # the dispatcher outlives any one failing pass
                        log.warning(
                            "dispatcher pass failed",
                            extra={"event": "dispatch.pass_failed", "error": str(exc)},
                        )
            finally:
                for task in list(self._tasks):
                    task.cancel()
