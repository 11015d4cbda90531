"""worker-control's schedule sync: one Temporal Schedule per schedule, kept in line with the
schedule's receipts (the chain is the record; Temporal only fires).

Each pass writes the schedules whose definition changed since Temporal last matched it (create,
update, pause, resume, delete; `synced_seq < definition_seq`, a partial index) and, every
`RECEIPT_SCHEDULE_CHECK_INTERVAL_MS` (30 s), lists Temporal's schedules to restore any the
receipts hold and Temporal lost (a server restarted without its database). A rebuilt
projection starts every `synced_seq` at 0, so `receipt rebuild-projections` also writes every
schedule to Temporal again.

The cron expression goes to Temporal as calendar specs built from the same parse the API
validated with (receipts/schedules/cron.py): a cron whose two day fields are both restricted is
two calendars (either day matches), as cron means it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleCalendarSpec,
    ScheduleHandle,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleRange,
    ScheduleSpec,
    ScheduleState,
    ScheduleUpdate,
    ScheduleUpdateInput,
)
from temporalio.service import RPCError, RPCStatusCode

from activities.names import SCHEDULE_FIRE_WORKFLOW
from receipts import metrics
from receipts.kinds import QUEUE_CONTROL
from receipts.schedules import cron
from receipts.schedules import model as schedule_model
from receipts.schedules import store as schedules
from receipts.settings import Settings
from receipts.store import Store
from workflows.schedule_fire import FIRE_PATIENCE

log = logging.getLogger("roles.delivery.schedules")

SYNC_INTERVAL_MS = 2_000
BATCH = 100
# The sync's single-flight lock across worker-control replicas (`Tx.try_lock_key`).
SYNC_LOCK_KEY = "receipt:schedule-sync"
MAX_BACKOFF_S = 300.0  # a schedule Temporal keeps refusing is tried again at most this rarely
# A Temporal that was down fires what it missed in the last minute, not a year of it.
CATCHUP_WINDOW = timedelta(minutes=1)
# A firing's run outlives its activity's patience through a database outage (FIRE_PATIENCE).
FIRE_TIMEOUT = FIRE_PATIENCE + timedelta(minutes=5)
ID_PREFIX = "receipt-schedule-"


def temporal_id(settings: Settings, schedule_id: str) -> str:
    """The Temporal Schedule's id of a schedule (prefixed like the task queues)."""
    return f"{settings.task_queue_prefix}{ID_PREFIX}{schedule_id}"


def _ranges(values: tuple[int, ...] | frozenset[int]) -> list[ScheduleRange]:
    return [ScheduleRange(v) for v in sorted(values)]


def spec_of(state: schedule_model.ScheduleState) -> ScheduleSpec:
    """When the schedule fires, as Temporal's spec."""
    if state.cron is None:
        return ScheduleSpec(
            intervals=[ScheduleIntervalSpec(every=timedelta(seconds=state.interval_s or 0))]
        )
    parsed = cron.parse_cron(state.cron)
    every_day, every_weekday = [ScheduleRange(1, 31)], [ScheduleRange(0, 6)]
    days, weekdays = _ranges(parsed.days), _ranges(parsed.weekdays)
    if parsed.any_day or parsed.any_weekday:
        day_fields = [(days, weekdays)]
    else:  # both restricted: either day matches
        day_fields = [(days, every_weekday), (every_day, weekdays)]
    calendars = [
        ScheduleCalendarSpec(
            second=[ScheduleRange(0)],
            minute=_ranges(parsed.minutes),
            hour=_ranges(parsed.hours),
            month=_ranges(parsed.months),
            day_of_month=in_month,
            day_of_week=in_week,
        )
        for in_month, in_week in day_fields
    ]
    return ScheduleSpec(calendars=calendars, time_zone_name=state.timezone)


def build(settings: Settings, state: schedule_model.ScheduleState) -> Schedule:
    """The Temporal Schedule of a schedule: at each fire time, `ScheduleFireWorkflow` on the
    control queue (every firing starts; the overlap policy is the receipts' to apply)."""
    return Schedule(
        action=ScheduleActionStartWorkflow(
            SCHEDULE_FIRE_WORKFLOW,
            state.schedule_id,
            id=temporal_id(settings, state.schedule_id) + "-fire",
            task_queue=settings.queue(QUEUE_CONTROL),
            execution_timeout=FIRE_TIMEOUT,
        ),
        spec=spec_of(state),
        policy=SchedulePolicy(
            overlap=ScheduleOverlapPolicy.ALLOW_ALL, catchup_window=CATCHUP_WINDOW
        ),
        state=ScheduleState(paused=state.status == "paused", note=state.note or ""),
    )


@dataclass
class SyncPass:
    """What one pass wrote."""

    created: int = 0
    updated: int = 0
    deleted: int = 0
    restored: int = 0
    orphaned: int = 0
    failed: int = 0


class ScheduleSync:
    """`run_once`: write the changed schedules to Temporal; every `check_s` also restore the
    ones Temporal lost and delete the ones the receipts do not hold."""

    name = "schedule_sync"

    def __init__(self, client: Client, store: Store, settings: Settings, check_s: float) -> None:
        self.client = client
        self.store = store
        self.settings = settings
        self.check_s = check_s
        self.checked_at = float("-inf")
        self.failures: dict[str, int] = {}  # schedule id → writes failed in a row
        self.retry_at: dict[str, float] = {}  # schedule id → when to try it again
        for action in ("failed", "list_failed"):  # from 0: an alert's increase() sees the first
            metrics.SCHEDULE_SYNCS.labels(action)

    async def run_once(self) -> SyncPass:
        """One pass, by one replica at a time: two writing at once could leave a schedule's
        older state in Temporal after the newer was written and marked synced."""
        async with self.store.transaction() as lock:
            if not await lock.try_lock_key(SYNC_LOCK_KEY):
                metrics.SCHEDULE_SYNCS.labels("skipped").inc()
                log.debug(
                    "schedule sync pass skipped: another process is syncing",
                    extra={"event": "schedule.sync_skipped"},
                )
                return SyncPass()
            return await self._pass()

    async def _pass(self) -> SyncPass:
        result = SyncPass()
        if time.monotonic() - self.checked_at >= self.check_s:
            result.restored, result.orphaned = await self._reconcile()
            self.checked_at = time.monotonic()
        now = time.monotonic()
        # The read reaches past the ones waiting out a backoff: a batch of schedules Temporal
        # keeps refusing would otherwise fill every read, and no other schedule be synced.
        waiting = sum(1 for at in self.retry_at.values() if at > now)
        for state, seq in await schedules.unsynced(self.store, BATCH + waiting):
            if self.retry_at.get(state.schedule_id, 0.0) > now:
                continue  # it failed lately: the others go first, it waits its backoff
            try:
                action = await self._write(state)
            except Exception as exc:  # one schedule Temporal refuses stops no other's sync
                failures = self.failures.get(state.schedule_id, 0) + 1
                self.failures[state.schedule_id] = failures
                self.retry_at[state.schedule_id] = now + min(
                    MAX_BACKOFF_S, SYNC_INTERVAL_MS / 1000 * 2**failures
                )
                result.failed += 1
                metrics.SCHEDULE_SYNCS.labels("failed").inc()
                log.warning(
                    "could not write a schedule to Temporal; trying again after a backoff",
                    extra={
                        "event": "schedule.sync_failed",
                        "scheduleId": state.schedule_id,
                        "error": f"{type(exc).__name__}: {exc}",
                        "failures": failures,
                    },
                )
                continue
            self.failures.pop(state.schedule_id, None)
            self.retry_at.pop(state.schedule_id, None)
            await schedules.mark_synced(self.store, state.schedule_id, seq)
            setattr(result, action, getattr(result, action) + 1)
            metrics.SCHEDULE_SYNCS.labels(action).inc()
            log.info(
                "schedule %s in Temporal",
                action,
                extra={"event": f"schedule.sync_{action}", "scheduleId": state.schedule_id},
            )
        return result

    async def _write(self, state: schedule_model.ScheduleState) -> str:
        sid = temporal_id(self.settings, state.schedule_id)
        handle = self.client.get_schedule_handle(sid)
        if state.terminal:
            await _deleted(handle)
            return "deleted"
        wanted = build(self.settings, state)
        try:
            await self.client.create_schedule(sid, wanted)
            return "created"
        except ScheduleAlreadyRunningError:

            def update(_: ScheduleUpdateInput) -> ScheduleUpdate:
                return ScheduleUpdate(schedule=wanted)

            await handle.update(update)
            return "updated"

    async def _reconcile(self) -> tuple[int, int]:
        """Mark for writing again the schedules the receipts hold and Temporal does not (lost:
        a server restarted without its database), and delete from Temporal the ones under this
        deployment's prefix the receipts do not hold (orphaned: made after the point the
        database was restored to, their firings find no schedule and enqueue nothing, for
        ever). Returns how many of each; (0, 0) when Temporal's cannot be listed."""
        prefix = temporal_id(self.settings, "")
        try:
            held = {
                listing.id.removeprefix(prefix)
                async for listing in await self.client.list_schedules()
                if listing.id.startswith(prefix)
            }
        except RPCError as exc:  # the next check tries again; lost ones stay lost meanwhile
            metrics.SCHEDULE_SYNCS.labels("list_failed").inc()
            log.warning(
                "could not list Temporal's schedules",
                extra={"event": "schedule.list_failed", "error": str(exc)},
            )
            return 0, 0
        # Read after the listing, under the sync's lock: a schedule made since is live here
        # (never an orphan), and only this pass writes Temporal's.
        live = await schedules.live_ids(self.store)
        lost = sorted(live - held)
        if lost:
            await schedules.resync(self.store, lost)
            metrics.SCHEDULE_SYNCS.labels("restored").inc(len(lost))
            log.warning(
                "Temporal had lost %d schedules; writing them again",
                len(lost),
                extra={"event": "schedule.restored", "scheduleIds": lost[:20]},
            )
        orphaned = 0
        for schedule_id in sorted(held - live):
            handle = self.client.get_schedule_handle(temporal_id(self.settings, schedule_id))
            try:
                if not await _deleted(handle):
                    continue  # deleted already (the listing lags a delete by a moment)
            except RPCError as exc:
                metrics.SCHEDULE_SYNCS.labels("failed").inc()
                log.warning(
                    "could not delete a Temporal schedule the receipts do not hold",
                    extra={
                        "event": "schedule.sync_failed",
                        "scheduleId": schedule_id,
                        "error": f"{type(exc).__name__}: {exc}",
                    },
                )
                continue
            orphaned += 1
            metrics.SCHEDULE_SYNCS.labels("orphaned").inc()
            log.warning(
                "deleted a Temporal schedule the receipts do not hold",
                extra={"event": "schedule.orphan_deleted", "scheduleId": schedule_id},
            )
        return len(lost), orphaned


async def _deleted(handle: ScheduleHandle) -> bool:
    """Delete the Temporal Schedule; False when Temporal held none by that id (gone already)."""
    try:
        await handle.delete()
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        return False
    return True
