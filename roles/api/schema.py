"""The documented shapes of the HTTP API: request and response models, error documentation.

The request models only document (the routes read and check raw JSON themselves, see
`roles.api.read_json_body`); the response models also build the job view every route returns.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic.json_schema import SkipJsonSchema

from receipts import jobs as jobmodel
from receipts.enqueue import MAX_DELAY_MS, MAX_ID_LENGTH
from receipts.jobs import Command, Job
from receipts.kinds import AGENT_IDS, CONTRACTS, KINDS_WITHOUT_AUTH, contract_queue, route

NON_BLANK = r"\S"

# The enumerations as types, for the documented request bodies (a unit test pins them to the
# tuples in receipts.jobs / receipts.kinds).
LaneName = Literal["chat", "collect", "steer", "follow_up"]
SingletonModeName = Literal["allow", "cancel", "steer"]
CommandTypeName = Literal["steer", "follow_up", "abort"]
KindName = Literal[
    "factory.dispatch",
    "factory.run",
    "factory.integration.publish",
    "factory.integration.validate",
    "factory.objective.audit",
    "factory.objective.control",
    "factory.objective.watchdog",
    "factory.task.monitor",
    "factory.task.run",
]


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


class AuthContext(_Doc):
    """Who the job acts for; `userId` and `organizationId` are required."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    user_id: str = Field(pattern=NON_BLANK)
    organization_id: str = Field(pattern=NON_BLANK)
    workspace_id: str | None = None
    receipt_connect_gateway_url: str | None = None
    session_id: str | None = None
    source: str | None = None


class EnqueuePayload(_Doc):
    """The job's input: its `kind` (one of nine), `authContext` (all kinds but the watchdog), more."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="allow",
        json_schema_extra={
            "if": {"properties": {"kind": {"not": {"enum": [*sorted(KINDS_WITHOUT_AUTH)]}}}},
            "then": {"required": ["authContext"]},
        },
    )

    kind: KindName
    auth_context: AuthContext | SkipJsonSchema[None] = Field(
        default=None, description="Required for every kind but factory.objective.watchdog"
    )


class EnqueueBody(_Doc):
    """An enqueue request. Unknown top-level fields are refused (422)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    job_id: str | None = Field(default=None, max_length=MAX_ID_LENGTH, pattern=NON_BLANK)
    lane: LaneName | None = None
    session_key: str | None = Field(default=None, max_length=MAX_ID_LENGTH, pattern=NON_BLANK)
    singleton_mode: SingletonModeName | None = None
    max_attempts: int | None = Field(default=None, description="clamped to 1..8; default 2")
    delay_ms: int | None = Field(default=None, ge=0, le=MAX_DELAY_MS)
    payload: EnqueuePayload


class CommandBody(_Doc):
    """A queue command for a job that is not terminal."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    type: CommandTypeName
    payload: Any = None
    reason: str | None = None


class JobView(Job):
    """A job as the API shows it: the folded state, its stream, routing and pending commands.

    `route` is the task queue it is delivered on (agent id first, kind second);
    `contractWorkerGroup`/`contractQueue` are what its kind's contract names. They can disagree
    (DESIGN §5); both are shown. `agentHasHandler` is false for an agent id no worker handles.
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


class CommandAccepted(_Doc):
    """A command appended to a job's stream."""

    command_id: str
    job_id: str
    type: str
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
    403: "The token's organization may not enqueue for the body's organization",
    404: "Unknown job (or agent id, in strict mode); another organization's job looks the same",
    409: "Conflict: a command on a terminal job, or a jobId owned by another organization",
    413: "Body larger than RECEIPT_MAX_BODY_BYTES",
    422: "Invalid input; `field` names the field and `allowed` its accepted values",
    503: "Database unavailable; retry after `Retry-After` seconds",
}


def errors_documented(*codes: int) -> dict[int | str, dict[str, Any]]:
    """Return the `responses` entries of a route's error answers (503 with `Retry-After`)."""
    documented: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        entry: dict[str, Any] = {"model": ErrorBody, "description": _ERROR_TEXT[code]}
        if code == 503:
            entry["headers"] = {
                "Retry-After": {
                    "description": "seconds to wait",
                    "schema": {"type": "integer"},
                }
            }
        documented[code] = entry
    return documented


def json_body_documented(model: str) -> dict[str, Any]:
    """Return the `openapi_extra` documenting a required JSON body of schema component `model`."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model}"}}},
        }
    }


def job_view(job: Job) -> dict[str, Any]:
    """Return the API's JSON form of a job (see `JobView`)."""
    contract = CONTRACTS.get(job.kind)
    task_queue = route(job.agent_id, job.kind)
    expected = contract_queue(job.kind)
    view = JobView.model_validate(
        {
            **dict(job),
            "stream": jobmodel.job_stream(job.job_id),
            "route": task_queue,
            "contract_worker_group": contract.worker_group if contract else None,
            "contract_queue": expected,
            "route_matches_contract": expected is None or expected == task_queue,
            "agent_has_handler": job.agent_id in AGENT_IDS,
            "pending": job.pending_commands,
        }
    )
    return view.to_json()
