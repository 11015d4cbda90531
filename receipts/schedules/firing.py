"""A schedule's firings: the job each fire time enqueues (idempotent by `<scheduleId>:<fire
time>`), decided under the schedule's stream lock on what is true then — its overlap policy on
the previous job, the organization's caps, a DST-repeated hour, a time the definition no longer
fires (README, *Schedules*)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from receipts import metrics
from receipts.enqueue import EnqueueRequest, enqueue_in, parse_enqueue, stop_draft
from receipts.enqueue_request import GATEWAY_FIELD, cap_timeout, gateway_refused
from receipts.errors import InvalidInput
from receipts.executables import refused_request
from receipts.jobs import TERMINAL_STATUSES
from receipts.kinds import CONTRACTS
from receipts.objectives import store as objectives
from receipts.schedules import cron
from receipts.schedules.model import ScheduleState, schedule_stream
from receipts.schedules.store import append, fire_id, get, job_id_of, load
from receipts.store import Draft, Store, Tx, translate_errors
from receipts.tenancy import scoped_id

log = logging.getLogger("receipts.schedules")

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


async def firing_request(
    reads: Store | Tx, state: ScheduleState, fire_time: datetime
) -> EnqueueRequest:
    """The enqueue the firing at `fire_time` makes: the stored body with the job id
    `<scheduleId>:<fire time>`, scoped (job id and objective id) by the schedule's organization."""
    body = {**state.job, "jobId": job_id_of(state.caller_schedule_id, fire_time)}
    request = parse_enqueue(state.agent_id, body)
    payload = request.payload
    objective_id = payload.get("objectiveId")
    contract = CONTRACTS[request.kind]
    if isinstance(objective_id, str) and contract.objective_scoped:
        existing = contract.objective_required and request.kind != "factory.run"
        runtime = await objectives.runtime_id(
            reads, state.organization_id, objective_id, existing=existing
        )
        payload = {**payload, "objectiveId": runtime}
    return dataclasses.replace(
        request,
        payload=payload,
        organization_id=state.organization_id,
        job_id=scoped_id(state.organization_id, str(body["jobId"])),
    )


def _owed(state: ScheduleState, fire_time: datetime) -> bool:
    """Whether the definition as it is now fires at `fire_time`: its local time in the schedule's
    zone matches the cron (either occurrence of an hour a DST change repeats), or it is a
    multiple of the interval since the epoch. A firing of an earlier definition, which Temporal
    may still hold until the sync reaches it, is not."""
    if state.interval_s is not None:
        return (fire_time - EPOCH).total_seconds() % state.interval_s == 0
    if state.cron is None:
        return False
    local = fire_time.astimezone(cron.zone(state.timezone))
    parsed = cron.parse_cron(state.cron)
    return (
        local.second == 0
        and local.microsecond == 0
        and local.minute in parsed.minutes
        and local.hour in parsed.hours
        and parsed.matches_day(local.date())
    )


def _other_occurrence(state: ScheduleState, fire_time: datetime) -> datetime | None:
    """For a cron schedule, the other instant of `fire_time`'s local time when a fall-back
    repeats that hour (the first occurrence of the second, or the second of the first); None
    for a local time that occurs once."""
    if state.cron is None:
        return None
    tz = cron.zone(state.timezone)
    local = fire_time.astimezone(tz)
    wall = local.replace(tzinfo=None)
    first, second = wall.replace(tzinfo=tz, fold=0), wall.replace(tzinfo=tz, fold=1)
    if first.utcoffset() == second.utcoffset():
        return None
    other = second if local.fold == 0 else first
    return other.astimezone(UTC)


async def _repeated_wall_time(tx: Tx, state: ScheduleState, fire_time: datetime) -> bool:
    """Whether the other occurrence of `fire_time`'s local time (an hour the fall-back repeats,
    which Temporal fires twice) was fired already: the schedule fires that local time once
    (README, *Schedules*). Read from the stream's record, not only the recent firings: a cron
    firing often in that hour has more than the projection keeps."""
    other = _other_occurrence(state, fire_time)
    if other is None:
        return False
    if state.firing_at(other) is not None:
        return True
    return await _recorded(tx, state, other)


async def _recorded(tx: Tx, state: ScheduleState, fire_time: datetime) -> bool:
    """Whether the schedule's stream records a firing (or a skip) of `fire_time`."""
    row = await tx.fetch_one(
        "schedule_firing_recorded",
        {"stream": schedule_stream(state.schedule_id), "fire_time": fire_time.isoformat()},
    )
    return row is not None


async def _handled_late(tx: Tx, state: ScheduleState, fire_time: datetime) -> bool:
    """Whether a firing the recent ones the projection keeps do not hold (Temporal delivering
    it late, after an outage, in any order) was handled already. The stream is read only when
    it could be: a fire time after the latest ever recorded is new, and while every firing so
    far is among the recent ones, one not there is new too."""
    latest = state.latest_fire_time
    if latest is not None and fire_time > latest:
        return False
    if state.fired + state.skipped <= len(state.recent):
        return False
    return await _recorded(tx, state, fire_time)


@dataclass(frozen=True, slots=True)
class Caps:
    """What the api holds a direct enqueue to and a firing is held to as well, read by the role
    that fires (worker-control) from the api's settings: the organization's caps of open jobs
    (`RECEIPT_ORG_MAX_QUEUED`, `RECEIPT_ORG_MAX_ACTIVE`), the cap on `timeoutMs`
    (`RECEIPT_MAX_TIMEOUT_MS`; None: none) and the organizations' allow-lists of executables
    (`RECEIPT_ORG_EXECUTABLES`), checked again at each firing: a list tightened after the
    schedule was made stops its firings."""

    max_queued: int
    max_active: int
    max_timeout_ms: int | None = None
    executables: Mapping[str, list[str]] = field(default_factory=dict)
    # A steer firing (`singletonMode: steer`) into the session's active job is held to the
    # per-job command caps (`RECEIPT_MAX_COMMANDS_PER_JOB`, `RECEIPT_MAX_COMMAND_BYTES`) as a
    # direct steer is: one that would not fit is recorded skipped (`commands`).
    max_commands: int | None = None
    max_command_bytes: int | None = None
    # `RECEIPT_GATEWAY_URL_ALLOWLIST`, checked again at each firing as the allow-list of
    # executables is: a gateway URL taken off it stops the firings that name it (None: none).
    gateway_urls: tuple[str, ...] | None = None


async def fire(
    store: Store,
    schedule_id: str,
    fire_time: datetime,
    caps: Caps | None = None,
    *,
    traceparent: str | None = None,
) -> str:
    """Enqueue the job of the firing at `fire_time` (Temporal's scheduled time) unless the
    overlap policy says otherwise or, with `caps`, the organization holds its cap of open jobs
    or the job runs a program off the organization's allow-list (skipped, as a refused enqueue
    would be; its `timeoutMs` is capped as an enqueue's is); return what it came to:
    `enqueued`, `skipped` (`skipped_cap` for the caps, `skipped_executables` for the list,
    `skipped_gateway` for a gateway URL off the operator's list),
    `repeated` (this fire time, or this local time of a repeated hour, was already handled: a
    doubled firing is one job), `off_schedule` (the definition as it is now does not fire then:
    Temporal still had an earlier one) or `none` (the schedule is paused, deleted or gone:
    Temporal fired before the sync caught up). The job's trace is `traceparent`'s (the
    firing's span) when given.

    Everything is decided under the schedule's stream lock on the schedule as it is then (the
    read before it only answers `none` and `repeated` without a transaction): the job it
    enqueues, the previous job's state (two firings at once see each other), and a `cancel_previous` abort is
    written in the same transaction as the firing it makes room for, so a skipped firing aborts
    nothing."""
    state = await get(store, schedule_id)
    if state is None or state.status != "active":
        return "none"
    if state.firing_at(fire_time) is not None:
        return "repeated"
    stream = schedule_stream(schedule_id)
    refusal: dict[str, str] = {}
    enqueued: dict[str, str] = {}

    async def work(tx: Tx) -> str:
        await tx.lock_streams([stream])
        current = await load(tx, schedule_id)
        if current is None or current.status != "active":
            return "none"
        if current.firing_at(fire_time) is not None:
            return "repeated"
        if await _repeated_wall_time(tx, current, fire_time):
            return "repeated"
        if await _handled_late(tx, current, fire_time):
            return "repeated"
        if not _owed(current, fire_time):
            return "off_schedule"
        # The job is built from the definition read under the lock, never from the read before
        # it: a change of `job` or `agentId` committed in between fires as changed.
        request = await firing_request(tx, current, fire_time)
        request = dataclasses.replace(request, traceparent=traceparent)
        if caps is not None and caps.max_timeout_ms is not None:
            request = cap_timeout(request, caps.max_timeout_ms)
        if caps is not None:
            request = dataclasses.replace(
                request, max_commands=caps.max_commands, max_command_bytes=caps.max_command_bytes
            )
        at = fire_time.isoformat()
        data: dict[str, Any]
        refused = refused_request(caps.executables, request.agent_id, request) if caps else None
        if refused is not None:
            # The allow-list as it is now, not as it was at create: a program taken off it
            # stops the schedule's firings as it stops a direct enqueue (which answers 403).
            refusal["field"], refusal["message"] = refused
            data = {"fireTime": at, "reason": "executables", **refusal}
            await append(tx, current, stream, [Draft("schedule.skipped", data)])
            return "skipped_executables"
        gateway = caps.gateway_urls if caps else None
        unlisted = gateway_refused(request, gateway) if gateway is not None else None
        if unlisted is not None:
            # The same for a gateway URL taken off the operator's list (a direct enqueue: 422).
            refusal["field"], refusal["message"] = GATEWAY_FIELD, unlisted
            data = {"fireTime": at, "reason": "gateway", **refusal}
            await append(tx, current, stream, [Draft("schedule.skipped", data)])
            return "skipped_gateway"
        previous = await tx.job_for_update(current.last_job_id) if current.last_job_id else None
        running = previous is not None and previous.status not in TERMINAL_STATUSES
        # A steer lands in the session's active job: aborting it first would steer the job just
        # aborted (and a steer the job cannot hold would leave it aborted for a skipped firing).
        # Refused at create and change; one stored before is not aborted: it fires as `allow`.
        replaces = current.overlap == "cancel_previous" and request.singleton_mode != "steer"
        if running and current.overlap == "skip" and previous is not None:
            data = {"fireTime": at, "reason": "overlap", "runningJobId": previous.job_id}
            await append(tx, current, stream, [Draft("schedule.skipped", data)])
            return "skipped"
        if caps is not None and current.organization_id is not None:
            row = await tx.fetch_one("enqueue_caps", {"organization_id": current.organization_id})
            assert row is not None
            queued, active = int(row[1]), int(row[2])
            replaced = running and replaces
            if replaced and previous is not None and previous.status == "queued":
                # Canceled with this firing (below): its place is the new job's, as a singleton
                # cancel's is (a leased or running one holds its place until it ends).
                queued, active = queued - 1, active - 1
            if queued >= caps.max_queued or active >= caps.max_active:
                data = {"fireTime": at, "reason": "cap"}
                await append(tx, current, stream, [Draft("schedule.skipped", data)])
                return "skipped_cap"
        canceled: str | None = None
        if running and replaces and previous is not None:
            reason = f"schedule {current.caller_schedule_id} fired again at {at}"
            command_id = f"schedule:{schedule_id}:{fire_id(fire_time)}"
            await tx.append_job(
                previous.job_id, previous, [stop_draft(previous, reason, command_id)]
            )
            canceled = previous.job_id
        try:
            result = await enqueue_in(tx, request)
        except InvalidInput as exc:
            # A steer the session's active job could not hold (its command caps): recorded, as
            # a direct steer is answered 422, instead of a firing retried for ever.
            refusal["field"], refusal["message"] = exc.field, exc.message
            data = {"fireTime": at, "reason": "commands", **refusal}
            await append(tx, current, stream, [Draft("schedule.skipped", data)])
            return "skipped_commands"
        enqueued["jobId"] = result.job.job_id
        data = {"fireTime": at, "jobId": result.job.job_id}
        if canceled is not None:
            data["canceledJobId"] = canceled
        await append(tx, current, stream, [Draft("schedule.fired", data)])
        return "enqueued"

    with translate_errors():
        outcome = await store.in_transaction(work)
    metrics.SCHEDULE_FIRINGS.labels(outcome).inc()
    if refusal:
        log.warning(
            "schedule firing refused: %s",
            refusal["message"],
            extra={
                "event": f"schedule.{outcome.removeprefix('skipped_')}_refused",
                "scheduleId": schedule_id,
                "organizationId": state.organization_id,
                "fireTime": fire_time.isoformat(),
                "field": refusal["field"],
            },
        )
    log.info(
        "schedule fired: %s",
        outcome,
        extra={
            "event": "schedule.fired",
            "scheduleId": schedule_id,
            "fireTime": fire_time.isoformat(),
            "outcome": outcome,
            "jobId": enqueued.get("jobId") if outcome == "enqueued" else None,
        },
    )
    return outcome
