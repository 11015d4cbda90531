"""The recovery loops. Each has a `run_once` (tests call it directly) and a ticker around it.

Several processes may run the same loop at once: lease expiry is a fenced append under the
job's row lock (one job per transaction), a redrive claims `<jobId>:redrive:<seq>:<attempt>`
under a unique key, callbacks claim `(jobId, event, url)`, and Temporal dedupes workflow ids.
No session-level advisory lock is used, so a transaction-mode pooler is fine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import httpx

from activities.driver import post_callbacks
from receipts import deliveries, fairness, metrics, reads
from receipts import operations as ops
from receipts.errors import ReceiptError
from receipts.listen import RECONNECTED, Listener, Notice
from receipts.notices import OBJECTIVES
from receipts.objectives import store as objectives
from receipts.objectives.model import STREAM_PREFIX as OBJECTIVE_STREAM_PREFIX
from receipts.settings import Settings
from receipts.store import Store
from receipts.waits import within
from roles.delivery.starter import DriverStarter
from roles.infra.settings import LoopSettings

log = logging.getLogger("roles.delivery.loops")

OUTBOX_BATCH = 200


# A redrive pass looks at this many jobs of each kind (expired leases, quiet deliveries, owed
# callbacks); the first pass waits this long after start, so a process restarting beside a
# running fleet does not redrive what the others are delivering.
REDRIVE_BATCH = 200
# The queued jobs a redrive pass reads for its candidates: a page of the queue after where the
# last pass's ended (the whole queue was ranked and sorted at every pass, and a pass looked at
# the same first jobs while they kept coming back after their cooldown). A job is looked at
# within (queued / REDRIVE_PAGE + 1) passes, sooner when fewer are due.
REDRIVE_PAGE = 1_000
# Batches of owed callbacks one pass goes through at most (a backlog drains over passes), and
# how: posted this many at a time, none started once the pass has spent its budget on them (a
# receiver that never answers costs each post its three tries of 5 s, and the pass's lease
# expiry and redrive wait for it).
CALLBACK_BATCHES = 10
CALLBACK_POSTS_AT_ONCE = 8
CALLBACK_PASS_BUDGET_S = 10.0
REDRIVE_STARTUP_DELAY_MS = 5_000
# What the owed callback posts a drain cut (their grace spent) get to give their claims back.
CALLBACK_RELEASE_S = 2.0


@dataclass
class PassResult:
    """What one redrive pass did."""

    expired: int = 0
    redriven: int = 0
    skipped: int = 0
    callbacks: int = 0
    failed: int = 0


class QueuedRedrive:
    """Expire passed leases, redrive queued jobs whose delivery went quiet, post lost callbacks."""

    name = "queued_redrive"

    def __init__(
        self,
        store: Store,
        starter: DriverStarter | None,
        settings: Settings,
        loops: LoopSettings | None = None,
        http: httpx.AsyncClient | None = None,
        stop: asyncio.Event | None = None,
    ) -> None:
        self.store = store
        self.starter = starter
        self.settings = settings
        self.loops = loops or LoopSettings()
        self.http = http
        self._cursor = deliveries.START  # where the next pass's page of the queue starts
        # Set when the role drains: no owed callback is claimed any more (`drain`).
        self._stop = stop or asyncio.Event()
        self._posting: set[asyncio.Task[int]] = set()  # owed callback posts under way
        self._claiming: set[asyncio.Task[Any]] = set()  # those past their turn: claiming, posting

    def ticker(self) -> Ticker:
        """The loop that runs it: every `redrive_interval_ms`, the first pass
        REDRIVE_STARTUP_DELAY_MS after start (the spec's 15 000 and 5 000 ms)."""
        return Ticker(
            self.name, self.run_once, self.loops.redrive_interval_ms, REDRIVE_STARTUP_DELAY_MS
        )

    async def run(self) -> None:
        """The ticker, until the role's close cancels it; the owed callback posts still under
        way then (a drain's, `drain`, are over by then) are cut too, their claims given back."""
        try:
            await self.ticker().run()
        finally:
            for task in self._posting:
                task.cancel()
            await asyncio.gather(*self._posting, return_exceptions=True)

    async def drain(self, grace_s: float) -> None:
        """Once `stop` is set (the role drains; no owed callback is claimed any more): wait up to
        `grace_s` for the posts in flight to be answered and recorded. Those still in flight
        then are cut (logged `callback.drain_cut`): each claim is given back and another driver
        posts it again. Cut at the role's close, a post its receiver was answering was heard
        twice, the second time at another driver's next pass."""
        if not self._posting:
            return
        _, cut = await asyncio.wait(set(self._posting), timeout=grace_s)
        if not cut:
            return
        if posts := len(cut & self._claiming):  # the others still wait their turn: unclaimed
            log.warning(
                "owed callback posts still in flight at the end of the shutdown grace are cut; "
                "their claims are given back and another driver posts them",
                extra={"event": "callback.drain_cut", "posts": posts, "graceS": grace_s},
            )
        for task in cut:
            task.cancel()
        await asyncio.wait(cut, timeout=CALLBACK_RELEASE_S)

    def _post(self, recovery: Coroutine[Any, Any, int]) -> asyncio.Task[int]:
        """Run one owed callback's recovery as a task of its own: a drain waits for it, where
        the pass itself is cancelled at the role's close."""
        task = asyncio.create_task(recovery)
        self._posting.add(task)
        task.add_done_callback(self._posting.discard)
        task.add_done_callback(self._claiming.discard)
        return task

    async def run_once(self) -> PassResult:
        """One pass: expiry, then redrive, then the callback recovery path."""
        result = PassResult()
        for job_id in await self._expired_leases():
            out = await ops.expire_lease(self.store, job_id)
            if out.ok:
                result.expired += 1
                metrics.LEASE_EXPIRATIONS.inc()  # here: a later failure of the pass keeps it
                log.warning(
                    "lease expired",
                    extra={
                        "event": "job.lease_expired",
                        "jobId": job_id,
                        "attempt": out.job.attempt if out.job else None,
                        "status": out.job.status if out.job else None,
                    },
                )
        if self.starter is not None:
            page = await deliveries.redrive_candidates(
                self.store,
                min_age_ms=self.loops.redrive_min_age_ms,
                cooldown_ms=self.loops.redrive_cooldown_ms,
                limit=REDRIVE_BATCH,
                page=REDRIVE_PAGE,
                caps=fairness.caps(self.settings),
                after=self._cursor,
            )
            self._cursor = page.next
            for job_id, seq, attempt in zip(page.job_ids, page.seqs, page.attempts, strict=True):
                claimed = await deliveries.claim_redrive(
                    self.store, job_id, seq, attempt, cooldown_ms=self.loops.redrive_cooldown_ms
                )
                if not claimed:
                    result.skipped += 1
                    continue
                try:
                    started = await self.starter.start(job_id)
                except Exception as exc:
                    # Nothing was delivered: give the observed state back to the next pass, and
                    # go on with the others (one job Temporal refuses must not end every pass
                    # before the jobs after it, and the callbacks owed).
                    await deliveries.release_redrive(self.store, job_id, seq, attempt)
                    result.failed += 1
                    metrics.REDRIVE_FAILURES.inc()
                    log.error(
                        "queued job redrive failed: %s",
                        exc,
                        extra={"event": "redrive.failed", "jobId": job_id},
                        exc_info=True,
                    )
                    continue
                if not started.created:
                    # An open delivery (or none possible): the key must not be spent, or this
                    # queue state could never be redriven once that delivery closes. Its cooldown
                    # restarts, so waiting jobs do not starve the rest of the scan.
                    await deliveries.release_redrive(self.store, job_id, seq, attempt)
                    await deliveries.touch(self.store, job_id)
                    result.skipped += 1
                    continue
                result.redriven += 1
                metrics.REDRIVES.inc()  # here: a later failure of the pass keeps the count
                if claimed == "again":
                    metrics.REDRIVES_AGAIN.inc()
                log.log(
                    logging.WARNING if claimed == "again" else logging.INFO,
                    "queued job redriven"
                    + (": its earlier redrive's delivery was lost" if claimed == "again" else ""),
                    extra={
                        "event": "redrive.dispatched",
                        "jobId": job_id,
                        "redriveKey": deliveries.redrive_key(job_id, seq, attempt),
                        "again": claimed == "again",
                        "driverCreated": started.created,
                        "reason": started.reason,
                    },
                )
        result.callbacks = await self._recover_callbacks()
        return result

    async def _expired_leases(self) -> list[str]:
        return await reads.expired_leases(self.store, REDRIVE_BATCH)

    async def _recover_callbacks(self) -> int:
        """Terminal states written outside a driver (singleton cancel, expiry past the budget,
        a driver that timed out) still get their terminal callback, once per URL. The owed
        posts are the callback outbox, written when the job settled and emptied when posted."""
        if self.http is None:  # not a role that posts callbacks (CALLBACK_ROLES)
            return 0
        if self._stop.is_set():  # the role drains: the other drivers post what is owed
            return 0
        urls = self.settings.callback_urls
        if not urls:
            await deliveries.drop_owed_callbacks(self.store)
            return 0
        http = self.http
        loop = asyncio.get_running_loop()
        ends = loop.time() + CALLBACK_PASS_BUDGET_S
        at_once = asyncio.Semaphore(CALLBACK_POSTS_AT_ONCE)

        async def recover(job_id: str, event: str) -> int:
            async with at_once:
                if loop.time() > ends or self._stop.is_set():
                    return 0  # still owed: the next pass (a draining role's: another driver's)
                if (current := asyncio.current_task()) is not None:
                    self._claiming.add(current)
                try:
                    job = await self.store.get_job(job_id)
                    posted = 0
                    if job is not None:
                        posted = await post_callbacks(
                            self.store, self.settings, http, job, event, stop=self._stop
                        )
                    await deliveries.settle_owed_callback(self.store, job_id, urls)
                    return posted
                except Exception:
                    metrics.CALLBACK_RECOVERIES_FAILED.inc()
                    log.exception(
                        "owed callback not recovered",
                        extra={"event": "callback.recovery_failed", "jobId": job_id},
                    )
                    return 0

        posted = 0
        for _ in range(CALLBACK_BATCHES):  # a full batch: more are due, go on (bounded)
            owed, more = await deliveries.owed_callbacks(self.store, urls, limit=REDRIVE_BATCH)
            posts = [self._post(recover(*row)) for row in owed]
            if posts:  # waited for, never cancelled with the pass (`drain` waits for them)
                await asyncio.wait(posts)
            posted += sum(p.result() for p in posts if not p.cancelled())
            if not more or loop.time() > ends or self._stop.is_set():
                break
        return posted


class ObjectiveControlOutboxRedrive:
    """Single-flight redrive of objective-control requests left in the outbox.

    A pass that outlives `timeout_ms` keeps ownership until it settles and logs
    `factory.control_outbox_redrive_slow`, so ticks coalesce instead of piling up. The outbox is
    filled by the Factory (objectives); `source` is its scan, returning how many requests it
    redrove.
    """

    name = "objective_control_outbox_redrive"

    def __init__(
        self,
        source: Callable[[], Coroutine[Any, Any, int]],
        *,
        interval_ms: int = 5_000,
        timeout_ms: int = 15_000,
    ) -> None:
        self.source = source
        self.interval_ms = interval_ms
        self.timeout_ms = timeout_ms
        self._running: asyncio.Task[int] | None = None
        self.coalesced = 0
        # From 0, as the failures are (Ticker): `increase()` sees the first slow pass.
        metrics.LOOP_SLOW.labels(self.name)

    @classmethod
    def of(
        cls,
        source: Callable[[], Coroutine[Any, Any, int]],
        loops: LoopSettings,
    ) -> ObjectiveControlOutboxRedrive:
        """The outbox redrive at RECEIPT_OBJECTIVE_CONTROL_OUTBOX_REDRIVE_{INTERVAL,TIMEOUT}_MS."""
        return cls(
            source,
            interval_ms=loops.outbox_interval_ms,
            timeout_ms=loops.outbox_timeout_ms,
        )

    async def run_once(self) -> int | None:
        """Run one pass unless one is still running (then this tick coalesces: returns None)."""
        if self._running is not None and not self._running.done():
            self.coalesced += 1
            return None
        self._running = asyncio.create_task(self.source())
        started = time.monotonic()
        done, _ = await asyncio.wait({self._running}, timeout=self.timeout_ms / 1000)
        if not done:
            log.warning(
                "objective-control outbox redrive pass is slow; it keeps ownership",
                extra={
                    "event": "factory.control_outbox_redrive_slow",
                    "timeoutMs": self.timeout_ms,
                },
            )
            metrics.LOOP_SLOW.labels(self.name).inc()
            await asyncio.wait({self._running})
        metrics.LOOP_PASS.labels(self.name).observe(time.monotonic() - started)
        return self._running.result()


@dataclass
class Ticker:
    """Run `run_once` every `interval_ms` after `first_delay_ms`; a failing pass is logged."""

    name: str
    run_once: Callable[[], Awaitable[object]]
    interval_ms: int
    first_delay_ms: int = 0
    wake: asyncio.Event | None = None

    async def run(self) -> None:
        """Tick until cancelled."""
        # The failure series exists at 0 from the start: `increase()` then sees the first
        # failure (a series born at 1 hides it, and the alerts count one failure short).
        metrics.LOOP_FAILED.labels(self.name)
        await asyncio.sleep(self.first_delay_ms / 1000)
        while True:
            started = time.monotonic()
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a loop must outlive any one failing pass
                metrics.LOOP_FAILED.labels(self.name).inc()
                log.warning(
                    "loop pass failed",
                    exc_info=not isinstance(exc, ReceiptError),
                    extra={"event": "loop.failed", "loop": self.name, "error": str(exc)},
                )
            elapsed = time.monotonic() - started
            if self.name != ObjectiveControlOutboxRedrive.name:  # it times its own passes
                metrics.LOOP_PASS.labels(self.name).observe(elapsed)
            delay = max(0.0, self.interval_ms / 1000 - elapsed)
            if self.wake is None:
                await asyncio.sleep(delay)
                continue
            with contextlib.suppress(TimeoutError):
                await within(self.wake.wait(), delay)
            self.wake.clear()


def objective_control_outbox(store: Store) -> Callable[[], Coroutine[Any, Any, int]]:
    """The outbox scan: deliver every objective's control requests not yet handed to a control
    job (or handed to one that ended without covering them), and audit the settled objectives
    whose audit job ended without auditing them. Returns how many requests it delivered."""

    async def scan() -> int:
        try:
            delivered = await objectives.redrive_outbox(store, OUTBOX_BATCH)
        finally:
            # And the audits no audit job will write any more (it ended without one), whatever
            # an objective's delivery met.
            await objectives.recover_lost_audits(store)
        if delivered:
            log.info(
                "objective control requests delivered",
                extra={"event": "factory.control_outbox_redriven", "count": delivered},
            )
        return delivered

    return scan


def is_control_request(notice: Notice) -> bool:
    """True for an append to an objective stream that carries a control request."""
    return notice is RECONNECTED or (
        notice.stream.startswith(OBJECTIVE_STREAM_PREFIX)
        and "objective.control_requested" in notice.types
    )


async def wake_on_control_requests(listener: Listener, wake: asyncio.Event) -> None:
    """Set `wake` at every control request appended anywhere (and after a reconnect), so the
    outbox delivers within moments instead of at its next tick."""
    async with listener.subscribe(channel=OBJECTIVES) as notices:
        while True:
            if is_control_request(await notices.get()):
                wake.set()


RESUME_RETRY_MAX_S = 60.0


class ObjectiveResume:
    """Once per process, after RESONATE_STARTUP_SETTLE_MS (and again after a failed pass, until
    one succeeds): request control for every active objective with no pending request and no
    active control job."""

    name = "objective_resume"

    def __init__(self, store: Store, limit: int = 2_000) -> None:
        self.store = store
        self.limit = limit

    async def run_once(self) -> int:
        """Request (and deliver) control for each such objective; return how many."""
        started = time.monotonic()
        candidates = await objectives.resume_candidates(self.store, self.limit)
        resumed = 0
        for objective_id in candidates:
            async with self.store.transaction() as tx:
                if await objectives.request_control(tx, objective_id, "resume") is not None:
                    resumed += 1
        log.info(
            "objective resume pass",
            extra={"event": "factory.objective_resume", "objectives": resumed},
        )
        metrics.LOOP_PASS.labels(self.name).observe(time.monotonic() - started)
        return resumed

    async def run(self, settle_ms: int, first_retry_s: float = 1.0) -> None:
        """Wait for the process to settle, then run until a pass succeeds: a failed pass (the
        database away as the role starts) is logged and counted, and tried again after 1 s,
        doubling to 60 s, so repeated failures reach the loop-failure alert and the objectives
        are resumed once the database is back."""
        await asyncio.sleep(settle_ms / 1000)
        retry_s = first_retry_s
        while True:
            try:
                await self.run_once()
                return
            except Exception as exc:  # logged and counted; tried again
                metrics.LOOP_FAILED.labels(self.name).inc()
                log.warning(
                    "objective resume failed; trying again in %.0f s",
                    retry_s,
                    extra={"event": "loop.failed", "loop": self.name, "error": str(exc)},
                )
            await asyncio.sleep(retry_s)
            retry_s = min(retry_s * 2, RESUME_RETRY_MAX_S)
