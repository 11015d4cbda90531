"""The dispatcher: wakes on `job.enqueued` notices and hands each new job to the driver starter."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from datetime import datetime
from typing import Any

from receipts import deliveries, fairness, metrics, notices
from receipts.jobs import job_id_of
from receipts.listen import RECONNECTED, Listener, Notice
from receipts.store import Store
from receipts.waits import within
from roles.delivery.starter import NOT_AVAILABLE, DriverStarter

log = logging.getLogger("roles.delivery.dispatcher")

MAX_IDLE_S = 60.0
# The `loop` label of a failed dispatcher pass (a refill, a notice's handling).
DISPATCHER_LOOP = "dispatcher"
# Queued jobs one batch of a rescan reads (a page of the queue, after where the last one ended:
# its cost does not grow with the queue); the next page follows at once, up to RESCAN_ROUNDS,
# until the rescan has read the newest queued job (once more from the oldest when it began
# mid-queue) or a batch found jobs none of which started.
RESCAN_BATCH = 500
RESCAN_ROUNDS = 20
# The rescan for a delayed job runs this long after its `availableAt`: a timer may fire a hair
# early, and a rescan that finds the job not yet due by the database clock would not find it
# again (the next `next_available_at` no longer lists it) before the idle rescan.
DUE_MARGIN_S = 0.05
# A rescan that failed (the database away) is tried again after this long: not at once (its
# deadline stayed in the past, and the loop rescanned as fast as the error came back).
RESCAN_RETRY_S = 1.0
# A start that failed (Temporal away) is retried by a rescan after RESCAN_RETRY_S, doubling to
# this while starts keep failing: the jobs start when Temporal is back, not at the redrive's
# next look (30 s after their last receipt) or the idle rescan's (60 s).
START_RETRY_MAX_S = 8.0
# Put in the dispatcher's own queue when a job's start waits for its `availableAt`: look again
# at when the soonest delayed job is due.
RETIME = Notice("", 0, ("retime",))
# Put there when a start failed: rescan soon (the failed job has no delivery, so the rescan
# finds it again).
RETRY = Notice("", 0, ("retry",))


class Dispatcher:
    """Enqueue never talks to Temporal: the receipt is the outbox, and this is its reader.

    After every (re)attach of the LISTEN connection it rescans for deliverable queued jobs that
    were never dispatched, so a wake-up lost while reconnecting is not a lost job. Jobs enqueued
    with a delay are dispatched when the database clock reaches their `availableAt`. Fair
    dispatch: a job held back because its organization holds every slot it may on the job's
    queue is started when a job of that organization settles there (`fairness.freed`); the
    rescan and the redrive start it at the latest.
    """

    def __init__(
        self, store: Store, listener: Listener, starter: DriverStarter, concurrency: int = 32
    ) -> None:
        self.store = store
        self.listener = listener
        self.starter = starter
        self._slots = asyncio.Semaphore(concurrency)
        self._tasks: set[asyncio.Task[object]] = set()
        # Jobs whose dispatch is pending (waiting for a slot, or starting): a refill, a notice or
        # a rescan that names one of them again skips it (one named while its start runs is
        # started once more after it). Both pruned as each dispatch ends.
        self._dispatching: set[str] = set()
        self._asked_again: set[str] = set()
        self._notices: asyncio.Queue[Notice] | None = None
        self._retry_s = RESCAN_RETRY_S
        self._retry_pending = False
        # Where the rescan's next page starts, and the jobs whose start failed since the last
        # rescan: the next one starts them again first, wherever its pages are (in seconds).
        self._cursor = deliveries.START
        self._failed: set[str] = set()

    async def run_once(self) -> int:
        """Dispatch the deliverable queued jobs never dispatched and not held back of the
        rescan's next page of the queue; return the count."""
        return (await self._scan())[0]

    async def _scan(self) -> tuple[int, int, bool]:
        """One batch of the rescan, the page after the last: the jobs it found, the drivers it
        started, and whether it read the newest queued job (the next starts from the oldest)."""
        caps = fairness.caps(self.starter.settings)
        page = await deliveries.undelivered_queued(
            self.store, limit=RESCAN_BATCH, caps=caps, after=self._cursor
        )
        self._cursor = page.next
        started = await asyncio.gather(*(self._dispatch(job_id) for job_id in page.job_ids))
        return len(page.job_ids), sum(started), page.last

    async def _rescan(self) -> float:
        """Rescan page after page, at most RESCAN_ROUNDS (a backlog left by an outage drains
        at the starter's pace, not a batch a minute), until it has read the newest queued job
        from the oldest on; a batch none of whose jobs could start waits for the next rescan.
        The time to it."""
        failed, self._failed = self._failed, set()
        await asyncio.gather(*(self._dispatch(job_id) for job_id in failed))
        began_at_start = self._cursor == deliveries.START
        for _ in range(RESCAN_ROUNDS):
            found, started, last = await self._scan()
            if found and not started:
                break
            if last:
                if began_at_start:
                    break
                began_at_start = True  # again from the oldest: the jobs before where it began
        return await self._timeout()

    async def _dispatch(self, job_id: str) -> bool:
        """Start the job's delivery; whether a driver was started. Not twice at once: every
        settle of an organization's job names its oldest waiting jobs holding no slot, and one
        whose start still waits for a slot here holds none (a 12 000-job backlog drained with
        seven refused starts per job started). A job named again while its start runs (the
        start may have read it before what the new request heard, a slot given back) is started
        once more after it, unless that start made its driver."""
        if job_id in self._dispatching:
            self._asked_again.add(job_id)
            return False
        self._dispatching.add(job_id)
        try:
            while True:
                async with self._slots:
                    self._asked_again.discard(job_id)  # this start reads what they heard
                    created = await self._start(job_id)
                if created or job_id not in self._asked_again:
                    return created
        finally:
            self._dispatching.discard(job_id)
            self._asked_again.discard(job_id)

    async def _start(self, job_id: str) -> bool:
        try:
            started = await self.starter.start(job_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one job's failure must not stop the others
            # The redrive loop and the next rescan pick the job up again.
            log.warning(
                "dispatch failed",
                extra={"event": "dispatch.failed", "jobId": job_id, "error": str(exc)},
            )
            self._failed.add(job_id)
            self._retry_soon()
            return False
        if started.created:
            self._retry_s = RESCAN_RETRY_S
        if started.reason == NOT_AVAILABLE and self._notices is not None:
            with contextlib.suppress(asyncio.QueueFull):
                self._notices.put_nowait(RETIME)
        return started.created

    async def _refill(self, settled_job_id: str) -> None:
        """Start the jobs a slot given back by `settled_job_id` lets through."""
        try:
            job_ids = await fairness.freed(self.store, settled_job_id, self.starter.settings)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the rescan and the redrive start them at the latest
            metrics.LOOP_FAILED.labels(DISPATCHER_LOOP).inc()
            log.warning(
                "refill after a settled job failed",
                extra={
                    "event": "dispatch.refill_failed",
                    "jobId": settled_job_id,
                    "error": str(exc),
                },
            )
            return
        await asyncio.gather(*(self._dispatch(job_id) for job_id in job_ids))

    def _retry_soon(self) -> None:
        if self._notices is not None and not self._retry_pending:
            with contextlib.suppress(asyncio.QueueFull):
                self._notices.put_nowait(RETRY)
                self._retry_pending = True

    def _spawn(self, work: Coroutine[Any, Any, object]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _timeout(self) -> float:
        soonest: datetime | None = await deliveries.next_available_at(self.store)
        if soonest is None:
            return MAX_IDLE_S
        delay = (soonest - await self.store.now()).total_seconds()
        return min(MAX_IDLE_S, max(0.05, delay + DUE_MARGIN_S))

    async def run(self) -> None:
        """Dispatch until cancelled."""
        loop = asyncio.get_running_loop()
        refills = fairness.capped(self.starter.settings)
        metrics.LOOP_FAILED.labels(DISPATCHER_LOOP)  # from 0: an alert's increase() sees the first
        async with self.listener.subscribe(channel=notices.DISPATCH) as queue:
            self._notices = queue
            try:
                # The first rescan at once, inside the loop: a failure of it is a failed pass
                # (it ended the dispatcher for the process's life when it ran before the loop).
                deadline = loop.time()
                while True:
                    notice: Notice | None = None
                    with contextlib.suppress(TimeoutError):
                        notice = await within(queue.get(), max(0.0, deadline - loop.time()))
                    try:
                        if notice is None or notice is RECONNECTED:
                            deadline = loop.time() + await self._rescan()
                        elif notice is RETRY:
                            self._retry_pending = False
                            deadline = min(deadline, loop.time() + self._retry_s)
                            self._retry_s = min(START_RETRY_MAX_S, self._retry_s * 2)
                        elif notice is RETIME:
                            deadline = min(deadline, loop.time() + await self._timeout())
                        elif "job.enqueued" in notice.types:
                            self._spawn(self._dispatch(job_id_of(notice.stream)))
                        elif refills and notices.SETTLED_TYPES.intersection(notice.types):
                            self._spawn(self._refill(job_id_of(notice.stream)))
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:  # the dispatcher outlives any one failing pass
                        metrics.LOOP_FAILED.labels(DISPATCHER_LOOP).inc()
                        log.warning(
                            "dispatcher pass failed",
                            extra={"event": "dispatch.pass_failed", "error": str(exc)},
                        )
                        if notice is None or notice is RECONNECTED:  # a rescan: again soon
                            deadline = loop.time() + RESCAN_RETRY_S
            finally:
                self._notices = None
                for task in list(self._tasks):
                    task.cancel()
