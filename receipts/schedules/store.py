"""Schedules' persistence: their definitions validated and appended to `schedules/<id>` with the
projection row, and what the Temporal sync reads and marks (a firing's job: firing.py)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from receipts import metrics
from receipts.enqueue import EnqueueRequest, parse_enqueue
from receipts.errors import ConflictError, InvalidInput
from receipts.projections import Projection
from receipts.reads import Page, Position, Viewer, page, seen_by
from receipts.schedules import cron
from receipts.schedules.model import (
    OVERLAPS,
    ScheduleState,
    definition_data,
    fold,
    schedule_stream,
)
from receipts.store import Draft, Store, Tx, translate_errors
from receipts.streams import same_json
from receipts.tenancy import caller_id, scoped_id

log = logging.getLogger("receipts.schedules")

SCHEDULES = Projection("schedules", ScheduleState, fold, "schedule_upsert", noun="schedule ")
NEXT_FIRE_TIMES = 5
# Fire times of a cron read to find its closest two: two days of a every-minute cron.
CRON_GAP_SAMPLE = 2 * 24 * 60 + 1


@dataclass(frozen=True, slots=True)
class Limits:
    """The operator's bounds on schedules: the shortest interval, and schedules per organization."""

    min_interval_s: int = 60
    max_per_organization: int = 100


@dataclass(frozen=True, slots=True)
class Definition:
    """A validated definition: when it fires, the job each firing enqueues, the overlap policy."""

    cron: str | None
    interval_s: int | None
    timezone: str
    agent_id: str
    job: dict[str, Any]
    overlap: str

    def data(self) -> dict[str, Any]:
        return {
            "cron": self.cron,
            "intervalS": self.interval_s,
            "timezone": self.timezone,
            "agentId": self.agent_id,
            "job": self.job,
            "overlap": self.overlap,
        }


def fire_id(fire_time: datetime) -> str:
    """The fire time in a job id: `20261204T171500Z`."""
    return fire_time.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


def job_id_of(caller_schedule_id: str, fire_time: datetime) -> str:
    """The id (the organization's) of the job the firing at `fire_time` enqueues."""
    return f"{caller_schedule_id}:{fire_id(fire_time)}"


# The longest `cron`, `interval` or `timezone` (every minute listed, `0,1,…,59 * * * *`, is 177).
MAX_WHEN_CHARS = 200


def validate(
    fields: Mapping[str, Any], organization_id: str | None, limits: Limits, *, admin: bool
) -> tuple[Definition, EnqueueRequest]:
    """Validate a definition's fields (`cron` or `interval`, `timezone`, `agentId`, `job`,
    `overlap`); raise InvalidInput naming the field. Returns it and the request a firing makes
    (its job id a placeholder), for the caller's admission checks."""
    has_cron, has_interval = fields.get("cron") is not None, fields.get("interval") is not None
    for name in ("cron", "interval", "timezone"):
        value = fields.get(name)
        if isinstance(value, str) and len(value) > MAX_WHEN_CHARS:
            # Never parsed, nor echoed back in the error (a 100 KB cron was, whole).
            raise InvalidInput(name, f"{name} is at most {MAX_WHEN_CHARS} characters")
    if has_cron == has_interval:
        raise InvalidInput("cron", "give exactly one of cron (e.g. '*/5 * * * *') and interval")
    timezone = fields.get("timezone") or "UTC"
    if not isinstance(timezone, str):
        raise InvalidInput("timezone", "timezone must be an IANA time zone name (e.g. UTC)")
    try:
        cron.zone(timezone)
    except cron.SpecError as exc:
        raise InvalidInput("timezone", str(exc)) from None
    interval_s = None
    expression = fields.get("cron")
    try:
        if has_cron:
            if not isinstance(expression, str):
                raise cron.SpecError("cron must be a string")
            parsed = cron.parse_cron(expression)
            now = datetime.now(UTC)
            coming = cron.next_times(
                cron=expression,
                interval_s=None,
                timezone=timezone,
                after=now,
                count=CRON_GAP_SAMPLE,
            )
            if not coming:
                raise cron.SpecError(f"{expression!r} matches no time in the next five years")
            # The floor holds for a cron as for an interval: its closest two firings (a day's
            # pattern repeats, so two days of them show it, and the days of each
            # daylight-saving change, which breaks it) are at least the shortest interval.
            gap = cron.closest_gap_s(parsed, cron.zone(timezone), coming, now)
            if gap < limits.min_interval_s:
                raise cron.SpecError(
                    f"{expression!r} fires {gap:g} s apart at its closest, shorter than "
                    f"the shortest interval allowed, {limits.min_interval_s} s"
                )
        else:
            interval = fields["interval"]
            if not isinstance(interval, str):
                raise cron.SpecError("interval must be a string such as '30s', '15m' or '1h'")
            interval_s = cron.parse_interval(interval, limits.min_interval_s)
    except cron.SpecError as exc:
        raise InvalidInput("cron" if has_cron else "interval", str(exc)) from None
    overlap = fields.get("overlap") or "skip"
    if overlap not in OVERLAPS:
        raise InvalidInput("overlap", f"overlap must be one of {', '.join(OVERLAPS)}", OVERLAPS)
    agent_id = fields.get("agentId")
    job = fields.get("job")
    if not isinstance(job, Mapping):
        raise InvalidInput("job", "job must be the enqueue body each firing posts (an object)")
    if "jobId" in job:
        raise InvalidInput("job.jobId", "job.jobId is set by each firing: <scheduleId>:<time>")
    try:
        request = parse_enqueue(agent_id if isinstance(agent_id, str) else "", job)
    except InvalidInput as exc:
        field = exc.field if exc.field == "agentId" else f"job.{exc.field}"
        raise InvalidInput(field, exc.message, exc.allowed) from None
    if overlap == "cancel_previous" and request.singleton_mode == "steer":
        # A steer lands in the session's active job, the one `cancel_previous` would abort:
        # each firing would abort it and steer the job it just aborted, and nothing new runs.
        raise InvalidInput(
            "overlap",
            "overlap cancel_previous cannot go with job.singletonMode steer (the steer lands in "
            "the job it would abort): use skip or allow",
            OVERLAPS,
        )
    if not admin and request.organization_id != organization_id:
        raise InvalidInput(
            "job.payload.authContext.organizationId",
            "job.payload.authContext.organizationId must be the token's organization",
        )
    definition = Definition(
        cron=expression if has_cron else None,
        interval_s=interval_s,
        timezone=timezone,
        agent_id=str(agent_id),
        job=dict(job),
        overlap=overlap,
    )
    return definition, request


async def get(store: Store, schedule_id: str) -> ScheduleState | None:
    """The schedule's folded state from the projection, or None."""
    with translate_errors():
        row = await store.fetch_one("schedule_get", {"schedule_id": schedule_id})
    return ScheduleState.model_validate(row[0]) if row else None


async def named(store: Store, schedule_id: str) -> list[str]:
    """The runtime ids of the live schedules an admin may mean by `schedule_id` (an
    organization's own id): at most two, enough to tell one from ambiguous."""
    with translate_errors():
        rows = await store.fetch("schedules_by_caller_id", {"schedule_id": schedule_id})
    return [str(row[0]) for row in rows]


async def load(tx: Tx, schedule_id: str) -> ScheduleState | None:
    """The schedule as its projection row holds it, read in the caller's transaction to write
    after it: its row locked, so a projection rebuild waits for the write (lock its stream
    first)."""
    row = await tx.fetch_one("schedule_get_for_update", {"schedule_id": schedule_id})
    return ScheduleState.model_validate(row[0]) if row else None


async def append(
    tx: Tx, state: ScheduleState | None, stream: str, drafts: list[Draft]
) -> ScheduleState:
    """Append `drafts` to the schedule's stream (as of `state`) and write its projection row."""
    receipts = await tx.append(stream, drafts, expected_seq=state.seq if state else 0)
    new = fold(receipts, state)
    assert new is not None
    await SCHEDULES.put(tx, new)
    return new


async def create(
    store: Store,
    organization_id: str | None,
    caller_schedule_id: str,
    definition: Definition,
    limits: Limits,
    *,
    paused: bool = False,
) -> tuple[ScheduleState, bool]:
    """Create the schedule and return it with `True`; a re-post of the same definition returns
    it unchanged with `False`. Raises ConflictError for another definition under its id, or a
    deleted schedule's id (ids are not reused: a firing's job id names the schedule), and
    LimitReached when the organization holds its cap of schedules; nothing is written then."""
    schedule_id = scoped_id(organization_id, caller_schedule_id)
    stream = schedule_stream(schedule_id)

    async def work(tx: Tx) -> tuple[ScheduleState, bool]:
        await tx.lock_streams([stream])
        existing = await load(tx, schedule_id)
        if existing is not None:
            same = same_json(definition_data(existing), definition.data())
            if existing.terminal or not same:
                raise ConflictError(
                    f"schedule {caller_schedule_id} already exists"
                    + (" (deleted: schedule ids are not reused)" if existing.terminal else "")
                    + " with another definition" * (not existing.terminal)
                )
            return existing, False
        # One organization's creates count one at a time: two racing for its last place
        # cannot both take it.
        await tx.lock_key(f"schedules:{organization_id or ''}")
        row = await tx.fetch_one("schedules_live_count", {"organization_id": organization_id})
        if row is not None and int(row[0]) >= limits.max_per_organization:
            raise LimitReached(
                f"the organization has {row[0]} schedules (RECEIPT_ORG_MAX_SCHEDULES)"
            )
        data = {
            "scheduleId": schedule_id,
            "callerScheduleId": caller_schedule_id,
            "organizationId": organization_id,
            "paused": paused,
            **definition.data(),
        }
        return await append(tx, None, stream, [Draft("schedule.created", data)]), True

    with translate_errors():
        state, created = await store.in_transaction(work)
    if created:
        metrics.SCHEDULE_CHANGES.labels("created").inc()
        log.info(
            "schedule created",
            extra={"event": "schedule.created", "scheduleId": schedule_id},
        )
    return state, created


class LimitReached(Exception):
    """The organization holds its cap of schedules; nothing was written."""


class DefinitionMoved(ConflictError):
    """The schedule's definition changed since the change was made from it: read it again."""


async def change(
    store: Store,
    schedule_id: str,
    *,
    definition: Definition | None = None,
    paused: bool | None = None,
    note: str | None = None,
    delete: bool = False,
    based_on: int | None = None,
) -> ScheduleState | None:
    """Change, pause, resume or delete a schedule (None when it does not exist or was deleted).
    Only what differs is recorded: a pause of a paused schedule writes nothing unless it
    brings a new `note` (None keeps the note).

    `based_on`: the `definition_seq` of the schedule the new `definition` was made from (a
    PATCH merges its fields onto what it read), or a resume was admitted on (the rights its
    firings need); when the definition changed since, nothing is written and `DefinitionMoved`
    is raised, so two changes at once never lose one, and a resume never starts firings of a
    definition it was not admitted for."""
    stream = schedule_stream(schedule_id)

    async def work(tx: Tx) -> ScheduleState | None:
        await tx.lock_streams([stream])
        state = await load(tx, schedule_id)
        if state is None or state.terminal:
            return None
        resuming = paused is False and state.status == "paused"
        moved = based_on is not None and state.definition_seq != based_on
        if moved and (definition is not None or resuming):
            raise DefinitionMoved(schedule_id)
        drafts: list[Draft] = []
        if delete:
            drafts.append(Draft("schedule.deleted", {}))
        else:
            if definition is not None and definition.data() != definition_data(state):
                drafts.append(Draft("schedule.changed", definition.data()))
            if paused is True and state.status != "paused":
                drafts.append(Draft("schedule.paused", {"note": note or ""}))
            elif paused is True and note is not None and note != state.note:
                drafts.append(Draft("schedule.paused", {"note": note}))  # a new reason
            if paused is False and state.status == "paused":
                drafts.append(Draft("schedule.resumed", {}))
        if not drafts:
            return state
        return await append(tx, state, stream, drafts)

    with translate_errors():
        state = await store.in_transaction(work)
    if state is not None:
        action = "deleted" if delete else "changed"
        metrics.SCHEDULE_CHANGES.labels(action).inc()
        log.info(
            "schedule %s", action, extra={"event": f"schedule.{action}", "scheduleId": schedule_id}
        )
    return state


async def schedules_page(
    store: Store, viewer: Viewer, *, after: Position | None, limit: int
) -> Page[ScheduleState]:
    """A page of the schedules `viewer` may see (not deleted), newest first."""
    params = seen_by(viewer, after, "schedule_id")
    states, more = await page(store, "api_list_schedules", params, limit)
    return Page([ScheduleState.model_validate(s) for s in states], more)


async def unsynced(store: Store, limit: int) -> list[tuple[ScheduleState, int]]:
    """Schedules whose Temporal Schedule does not match yet, with the seq to mark once it does."""
    with translate_errors():
        rows = await store.fetch("schedules_unsynced", {"limit": limit})
    return [(ScheduleState.model_validate(row[0]), int(row[1])) for row in rows]


async def mark_synced(store: Store, schedule_id: str, seq: int) -> None:
    async with store.transaction() as tx:
        await tx.execute("schedule_synced", {"schedule_id": schedule_id, "seq": seq})


async def live_ids(store: Store) -> set[str]:
    """Every schedule Temporal should hold (active or paused)."""
    with translate_errors():
        rows = await store.fetch("schedules_live", {})
    return {str(row[0]) for row in rows}


async def resync(store: Store, schedule_ids: list[str]) -> None:
    """Have the sync write these schedules to Temporal again (Temporal lost them)."""
    async with store.transaction() as tx:
        await tx.execute("schedules_resync", {"schedule_ids": schedule_ids})


def shown_id(state: ScheduleState) -> str:
    """The id the schedule's organization knows it by."""
    return caller_id(state.schedule_id)
