"""A schedule's folded state: its definition (when, which job, what to do when the previous
one is still running), whether it is paused or deleted, and its recent firings — a pure fold of
its `schedules/<id>` receipts.

Receipts: `schedule.created` and `schedule.changed` (the definition), `schedule.paused`,
`schedule.resumed`, `schedule.deleted` (terminal), `schedule.fired` (`fireTime`, `jobId`, and
`canceledJobId` when the previous job was aborted for it) and `schedule.skipped` (`fireTime`,
`reason`: `overlap` with `runningJobId`, the previous job still active under the policy `skip`,
`cap`, the organization holding its cap of queued or active jobs, `executables` with `field`
and `message`, a program off the organization's allow-list, or `gateway`, a gateway URL off
the operator's); `schedule.compacted`
(`fired`, `skipped`, `lastJobId`: the totals when retention deleted older firings,
receipts/schedules/compaction.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, ClassVar, Literal

from receipts import streams
from receipts.errors import InvariantError
from receipts.streams import CamelModel, Receipt, StreamState

STREAM_PREFIX = "schedules/"
Overlap = Literal["skip", "allow", "cancel_previous"]
OVERLAPS: tuple[str, ...] = ("skip", "allow", "cancel_previous")
RECENT_FIRINGS = 10
DEFINITION_TYPES = frozenset(
    {
        "schedule.created",
        "schedule.changed",
        "schedule.paused",
        "schedule.resumed",
        "schedule.deleted",
    }
)


def schedule_stream(schedule_id: str) -> str:
    return STREAM_PREFIX + schedule_id


class Firing(CamelModel):
    """One fire time and what it came to: the job it enqueued, or why it enqueued none."""

    fire_time: datetime
    outcome: Literal["enqueued", "skipped"]
    job_id: str | None = None  # the runtime's id (scoped by organization)
    running_job_id: str | None = None  # skipped: the job still active
    reason: str | None = None  # skipped: why (`overlap`, `cap` of jobs, `executables`)
    canceled_job_id: str | None = None  # cancel_previous: the job aborted for this one
    recorded_at: datetime


class ScheduleState(StreamState):
    """The folded state of `schedules/<scheduleId>`."""

    STREAM_PREFIX: ClassVar[str] = STREAM_PREFIX
    ID_FIELD: ClassVar[str] = "schedule_id"
    TERMINAL: ClassVar[frozenset[str]] = frozenset({"deleted"})

    schedule_id: str  # the runtime's id: `<caller's id>~<organization tag>`
    caller_schedule_id: str  # the id its organization chose
    organization_id: str | None
    status: Literal["active", "paused", "deleted"]
    cron: str | None = None
    interval_s: int | None = None
    timezone: str = "UTC"
    agent_id: str
    job: dict[str, Any]  # the enqueue body each firing posts (without a jobId)
    overlap: Overlap = "skip"
    note: str = ""
    definition_seq: int  # the seq of the last receipt that changed when or whether it fires
    fired: int = 0
    skipped: int = 0
    last_job_id: str | None = None
    recent: tuple[Firing, ...] = ()
    # The latest fire time ever recorded: a firing after it is new without reading the stream
    # (None in a row written before it was kept: then the stream is read).
    latest_fire_time: datetime | None = None

    def firing_at(self, fire_time: datetime) -> Firing | None:
        """The recorded firing of `fire_time`, if it is among the recent ones."""
        return next((f for f in self.recent if f.fire_time == fire_time), None)


def _definition(data: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "cron": data.get("cron"),
        "interval_s": data.get("intervalS"),
        "timezone": data.get("timezone") or "UTC",
        "agent_id": data["agentId"],
        "job": dict(data["job"]),
        "overlap": data.get("overlap") or "skip",
    }


def definition_data(state: ScheduleState) -> dict[str, Any]:
    """The definition fields of a `schedule.created`/`schedule.changed` receipt of `state`."""
    return {
        "cron": state.cron,
        "intervalS": state.interval_s,
        "timezone": state.timezone,
        "agentId": state.agent_id,
        "job": state.job,
        "overlap": state.overlap,
    }


def apply(state: ScheduleState | None, receipt: Receipt) -> ScheduleState:
    """Fold one receipt into the schedule."""
    data, at, seq = receipt.data, receipt.recorded_at, receipt.seq
    if state is None:
        if receipt.type != "schedule.created":
            raise InvariantError(f"Invariant: no schedule for {receipt.stream}")
        return ScheduleState(
            schedule_id=data["scheduleId"],
            caller_schedule_id=data["callerScheduleId"],
            organization_id=data.get("organizationId"),
            status="paused" if data.get("paused") else "active",
            note=data.get("note") or "",
            definition_seq=seq,
            created_at=at,
            updated_at=at,
            seq=seq,
            **_definition(data),
        )
    if receipt.type == "schedule.compacted":
        # Retention deleted older firings: the totals as they stood (a rebuild folds the
        # firings that are left, then these), whatever the schedule's status.
        latest = data.get("latestFireTime")
        return state.model_copy(
            update={
                "seq": seq,
                "fired": data["fired"],
                "skipped": data["skipped"],
                "last_job_id": data.get("lastJobId"),
                "latest_fire_time": datetime.fromisoformat(latest) if latest else None,
            }
        )
    update: dict[str, Any] = {"seq": seq, "updated_at": at}
    if state.terminal:
        return state.model_copy(update={"seq": seq})
    kind = receipt.type
    if kind in DEFINITION_TYPES:
        update["definition_seq"] = seq
    if kind == "schedule.changed":
        update.update(_definition({**definition_data(state), **data}))
    elif kind == "schedule.paused":
        update.update(status="paused", note=data.get("note") or "")
    elif kind == "schedule.resumed":
        update.update(status="active", note="")
    elif kind == "schedule.deleted":
        update.update(status="deleted", settled_at=at)
    elif kind in ("schedule.fired", "schedule.skipped"):
        fired = kind == "schedule.fired"
        firing = Firing(
            fire_time=datetime.fromisoformat(data["fireTime"]),
            outcome="enqueued" if fired else "skipped",
            job_id=data.get("jobId"),
            running_job_id=data.get("runningJobId"),
            canceled_job_id=data.get("canceledJobId"),
            reason=data.get("reason") if not fired else None,
            recorded_at=at,
        )
        update["recent"] = (firing, *state.recent)[:RECENT_FIRINGS]
        latest = state.latest_fire_time
        if latest is not None:
            update["latest_fire_time"] = max(latest, firing.fire_time)
        elif state.fired + state.skipped == 0:
            update["latest_fire_time"] = firing.fire_time
        # else unknown (a row folded before it was kept): it stays so until a rebuild refolds it
        if fired:
            # Even delivered late: the overlap policy was checked against the previous job
            # before it was enqueued, so its job is the one that runs now.
            update.update(fired=state.fired + 1, last_job_id=data.get("jobId"))
        else:
            update["skipped"] = state.skipped + 1
    else:
        raise InvariantError(f"Invariant: {kind} is not a schedule receipt")
    return state.model_copy(update=update)


def fold(receipts: Iterable[Receipt], state: ScheduleState | None = None) -> ScheduleState | None:
    """Fold receipts in order from `state` (None: the empty stream)."""
    return streams.fold(apply, receipts, state)
