"""The shapes of the HTTP API: request and response models, error documentation.

The request models validate the bodies and document them from the same definition
(`EnqueueBody` is the domain's, in `receipts.enqueue`); the response models also build the job
view every route returns.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic.json_schema import SkipJsonSchema

from receipts import jobs as jobmodel
from receipts.agent_jobs.model import AgentJob
from receipts.enqueue import EnqueueBody, choice_field
from receipts.jobs import COMMAND_TYPES, LANES, SINGLETON_MODES, Command, Job
from receipts.kinds import CONTRACTS, KINDS, contract_queue, has_handler, redact_payload, route
from receipts.objectives.model import ObjectiveState, ObjectiveStatus, TaskState
from receipts.schedules.model import Firing, ScheduleState
from receipts.tenancy import caller_id, untagged

__all__ = ["CommandBody", "EnqueueBody"]

# The enumerations as types, for callers that want them: built from the domain's tuples
# (`receipts.jobs`, `receipts.kinds`), never copied.
LaneName = Literal[LANES]  # type: ignore[valid-type]
SingletonModeName = Literal[SINGLETON_MODES]  # type: ignore[valid-type]
CommandTypeName = Literal[COMMAND_TYPES]  # type: ignore[valid-type]
KindName = Literal[KINDS]  # type: ignore[valid-type]


class _Doc(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class ErrorDetail(_Doc):
    """What went wrong: a stable `code`, a readable `message`, the field at fault and its choices."""

    code: str
    message: str
    field: str | None = None
    allowed: list[str] | None = None


class ErrorBody(_Doc):
    """The one error shape of the API."""

    error: ErrorDetail


if TYPE_CHECKING:
    CommandTypeField = str
else:
    CommandTypeField = choice_field("type", COMMAND_TYPES, required=True)


class CommandBody(BaseModel):
    """A queue command for a job that is not terminal (validates the body and documents it)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=False,
        extra="forbid",
        json_schema_extra={"required": ["type"]},
    )

    type: CommandTypeField = Field(default=None, validate_default=True)
    payload: Any = None
    reason: str | None = Field(default=None, max_length=4096)


class JobView(Job):
    """A job as the API shows it: the folded state, its stream, routing and pending commands.

    `route` is the task queue it is delivered on (agent id first, kind second);
    `contractWorkerGroup`/`contractQueue` are what its kind's contract names. They can disagree
    (docs/design.md §5); both are shown. `agentHasHandler` is false for an agent id no worker handles.
    """

    stream: str
    route: str
    contract_worker_group: str | None
    contract_queue: str | None
    route_matches_contract: bool
    agent_has_handler: bool
    pending: tuple[Command, ...] = Field(alias="pendingCommands")


class AsyncInfo(_Doc):
    """Where to follow an accepted job."""

    job_id: str
    stream: str
    job_url: str
    events_url: str
    status: str
    idempotency_mismatch: bool = Field(
        default=False,
        description="True when a re-post named an existing job with another agent or payload: "
        "the existing job is returned unchanged, as for any re-post",
    )


class EnqueueAccepted(BaseModel):
    """The answer to an enqueue: the job (new, existing or steered) and where to follow it."""

    model_config = ConfigDict(populate_by_name=True)

    job: JobView
    outcome: Literal["created", "existing", "steered"]
    async_: AsyncInfo = Field(alias="async")


class JobList(_Doc):
    """One page of jobs, newest first; pass `nextCursor` as `cursor` for the next page."""

    jobs: list[JobView]
    next_cursor: str | None


class ObjectiveSummary(_Doc):
    """One objective in a list: its status, phase and how many of its tasks completed."""

    objective_id: str
    organization_id: str
    title: str
    status: ObjectiveStatus
    phase: int
    tasks: int
    completed_tasks: int
    error: str | None
    created_at: datetime
    updated_at: datetime


class ObjectiveList(_Doc):
    """One page of objectives, newest first; pass `nextCursor` as `cursor` for the next page."""

    objectives: list[ObjectiveSummary]
    next_cursor: str | None


class ScheduleRun(Firing):
    """One recent firing: its fire time, what it came to and its job's status now."""

    job_status: Literal[jobmodel.STATUSES] | None = None  # type: ignore[valid-type]


class ScheduleView(ScheduleState):
    """A schedule: its definition, whether it is paused, its next fire times (none while paused)
    and its last firings with their jobs."""

    next_fire_times: list[datetime]
    last_runs: list[ScheduleRun]
    stream: str


class ScheduleList(_Doc):
    """One page of schedules, newest first; pass `nextCursor` as `cursor` for the next page."""

    schedules: list[ScheduleView]
    next_cursor: str | None


class ObjectiveAccepted(_Doc):
    """The answer to an objective's creation: its id, its `factory.run` job (new, or the existing
    one for a re-post) and where to follow it."""

    objective_id: str
    outcome: Literal["created", "existing", "steered"]
    job: JobView
    job_url: str
    objective_url: str
    events_url: str
    cancel_url: str


class ObjectiveTaskView(TaskState):
    """A task as an objective's view shows it: its state, and its current try's job."""

    current_job_id: str | None = Field(default=None, alias="jobId")
    attempt: int = Field(description="Tries so far")
    job_status: str | None = Field(default=None, description="The current try's job's status")


class ObjectiveView(ObjectiveState):
    """The folded objective: phase, task graph, each task's status, tries and job."""

    # Kept with the state for the jobs it enqueues, not shown: their `traceId` is its trace.
    traceparent: SkipJsonSchema[str | None] = Field(default=None, exclude=True)
    tasks: tuple[ObjectiveTaskView, ...] = ()
    stream: str


class ObjectiveEventsPage(_Doc):
    """An objective's receipts with `seq > after`, in order; `lastSeq` is where the next page
    starts."""

    objective_id: str
    status: ObjectiveStatus
    receipts: list[ReceiptView]
    last_seq: int


class LatestStatus(_Doc):
    """The latest-status projection: `interrupted` / `request_user_input` while the job waits on
    its user, else its status."""

    state: str
    error_code: str | None
    pending_tool_call: dict[str, Any] | None
    answered: bool | None = None


class AgentJobLinks(_Doc):
    """Where to read, follow and answer an agent job (`turnJob`: its current turn's queue job)."""

    self_: str = Field(alias="self")
    events: str
    input: str
    session_events: str
    turn_job: str | None


class AgentJobView(AgentJob):
    """An agent job as the API shows it: its folded state, latest status, streams and links."""

    # Kept with the state for its turns' queue jobs, not shown: their `traceId` is its trace.
    traceparent: SkipJsonSchema[str | None] = Field(default=None, exclude=True)
    latest: LatestStatus = Field(alias="latestStatus")  # `latest_status()` is the model's
    stream: str
    session_stream: str
    links: AgentJobLinks | None = None


class AgentJobAnswer(_Doc):
    """An agent job after a create (201 new, 200 the existing one), an answer or a cancel."""

    agent_job: AgentJobView
    created: bool | None = None


class AgentJobList(_Doc):
    """One page of agent jobs; pass `nextCursor` as `cursor` for the next page."""

    agent_jobs: list[AgentJobView]
    next_cursor: str | None


class ObjectiveCancelAccepted(_Doc):
    """A cancel was recorded: control aborts the objective's running jobs and settles it."""

    objective_id: str
    status: ObjectiveStatus
    cancel_requested: bool


class ReceiptView(_Doc):
    """One receipt of a job's stream."""

    stream: str
    seq: int
    type: str
    data: dict[str, Any]
    recorded_at: datetime
    position: int


class EventsPage(_Doc):
    """A job's receipts with `seq > after`, in order; `lastSeq` is where the next page starts."""

    job_id: str
    stream: str
    status: str
    receipts: list[ReceiptView]
    last_seq: int


class AgentJobEventsPage(_Doc):
    """An agent job's receipts with `seq > after`, in order; `lastSeq` is where the next page
    starts."""

    agent_job_id: str
    stream: str
    status: str
    receipts: list[ReceiptView]
    last_seq: int


class AgentJobTurn(_Doc):
    """One turn of an agent job: its queue job and how it ended (None while it has not)."""

    job_id: str
    stream: str
    status: str | None
    result: Any = None
    error: str | None


class AgentJobDetail(_Doc):
    """The console's view of an agent job: its state, its turns' queue jobs, the wakeups it
    wrote to its owner session and its receipts."""

    agent_job: AgentJobView
    turns: list[AgentJobTurn]
    wakeups: list[ReceiptView]
    receipts: list[ReceiptView]


class SessionEventsPage(_Doc):
    """An owner session's receipts (its wakeups) with `seq > after`, in order."""

    session_id: str
    stream: str
    receipts: list[ReceiptView]
    last_seq: int


class CommandAccepted(_Doc):
    """A command appended to a job's stream."""

    command_id: str
    job_id: str
    type: str
    read_by_handler: bool = Field(
        description="Whether this job's handler reads a command of this type (an abort always "
        "stops it); one it does not is settled queue.command.unconsumed when the job ends"
    )
    job: JobView


class Health(_Doc):
    """The process is up."""

    status: Literal["ok"]


class Ready(_Doc):
    """The database is reachable and every migration this code ships is applied."""

    status: Literal["ready"]
    schema_version: int


_ERROR_TEXT = {
    400: "Malformed JSON body",
    401: "Missing or unknown bearer token",
    403: "The token lacks the scope, or its organization may not act for the body's",
    404: "Unknown job (or agent id, in strict mode); another organization's job looks the same",
    409: "Conflict: a command on a terminal job, or (admin) an organization's id that several "
    "organizations use (a re-posted jobId, whatever its payload, answers 202 with the job)",
    413: "Body larger than RECEIPT_MAX_BODY_BYTES",
    415: "Open mode (no tokens) takes only requests declared Content-Type: application/json, "
    "with a body or without one",
    422: "Invalid input; `field` names the field and `allowed` its accepted values",
    429: "A limit was reached (rate, queued or active jobs, open streams); see `Retry-After`",
    503: "Database unavailable; retry after `Retry-After` seconds",
}


def errors_documented(*codes: int) -> dict[int | str, dict[str, Any]]:
    """Return the `responses` entries of a route's error answers (503 with `Retry-After`)."""
    documented: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        entry: dict[str, Any] = {"model": ErrorBody, "description": _ERROR_TEXT[code]}
        if code in (429, 503):
            entry["headers"] = {
                "Retry-After": {
                    "description": "seconds to wait",
                    "schema": {"type": "integer"},
                }
            }
        documented[code] = entry
    return documented


def json_body_documented(model: str, *, required: bool = True) -> dict[str, Any]:
    """Return the `openapi_extra` documenting a JSON body of schema component `model`."""
    return {
        "requestBody": {
            "required": required,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model}"}}},
        }
    }


def shown_receipt(
    receipt: dict[str, Any],
    job_id: str | None = None,
    shown_id: str | None = None,
    organization_id: str | None = None,
) -> dict[str, Any]:
    """A receipt's JSON as the caller sees it: `task.env` values redacted (the enqueue receipt
    carries them) and, when the caller knows the job as `shown_id`, the runtime's `job_id`
    replaced by it in `stream` and `data.jobId`; for an organization (`organization_id`) the
    runtime's tag is dropped from every id in the data (an organization never sees it)."""
    data = receipt.get("data")
    if isinstance(data, dict):
        if "payload" in data:
            data = {**data, "payload": redact_payload(data["payload"])}
        if organization_id is not None:
            data = untagged(data, organization_id)
        if shown_id is not None and data.get("jobId") == job_id:
            data = {**data, "jobId": shown_id}
        if shown_id is not None:
            for link in ("retryOf", "retriedAs"):
                if isinstance(data.get(link), str):
                    data = {**data, link: caller_id(data[link])}
        receipt = {**receipt, "data": data}
    if shown_id is not None and job_id is not None:
        receipt = {**receipt, "stream": jobmodel.job_stream(shown_id)}
    return receipt


def job_view(job: Job, shown_id: str | None = None) -> dict[str, Any]:
    """Return the API's JSON form of a job (see `JobView`).

    `shown_id` is the job id the caller knows (an organization's own id, docs/design.md §4), shown in
    `jobId` and `stream` (the runtime's stream is `jobs/<runtime id>`). `task.env` values are
    redacted.
    """
    contract = CONTRACTS.get(job.kind)
    task_queue = route(job.agent_id, job.kind)
    expected = contract_queue(job.kind)
    view = JobView.model_validate(
        {
            **dict(job),
            "job_id": shown_id if shown_id is not None else job.job_id,
            "payload": redact_payload(job.payload),
            "stream": jobmodel.job_stream(shown_id if shown_id is not None else job.job_id),
            "route": task_queue,
            "contract_worker_group": contract.worker_group if contract else None,
            "contract_queue": expected,
            "route_matches_contract": expected is None or expected == task_queue,
            "agent_has_handler": has_handler(job.agent_id),
            "pending": job.pending_commands,
            **(_linked_ids(job) if shown_id is not None else {}),
        }
    )
    shown = view.to_json()
    if shown_id not in (None, job.job_id) and job.organization_id is not None:
        # An organization never sees the runtime's tag: not in the objective its payload names,
        # the ids in its result, its error text (`receipts/tenancy.py`).
        shown = untagged(shown, job.organization_id)
    return shown


def _linked_ids(job: Job) -> dict[str, str | None]:
    """A job's retry links as its organization names them."""
    return {
        "retry_of": caller_id(job.retry_of) if job.retry_of else None,
        "retried_as": caller_id(job.retried_as) if job.retried_as else None,
    }


def shown_job_id(job: Job, organization_id: str | None) -> str:
    """The id a caller of `organization_id` (None: admin) knows the job by."""
    return caller_id(job.job_id) if organization_id is not None else job.job_id
