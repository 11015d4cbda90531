# The API's schemas as pydantic models, generated from clients/python/openapi.json by
# `make client` (tools/client_models.py, datamodel-code-generator): do not edit by hand.

from __future__ import annotations

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, RootModel
from typing import Any, Literal
from receipt_client.models._part1 import *
from receipt_client.models._part2 import *


class TaskBody(BaseModel):
    """
    One task of an objective's graph, run after the tasks it depends on.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    agent_id: Literal["codex"] = Field("codex", alias="agentId", title="Agentid")
    depends_on: list[str] | None = Field(None, alias="dependsOn", title="Dependson")
    execution_path: Literal["local", "computer"] = Field(
        "local", alias="executionPath", title="Executionpath"
    )
    input: CommandInput | PromptInput = Field(..., title="Input")
    max_attempts: int = Field(1, alias="maxAttempts", ge=1, le=8, title="Maxattempts")
    task_id: str = Field(..., alias="taskId", pattern="^[A-Za-z0-9._-]{1,64}$", title="Taskid")
    timeout_ms: TimeoutMs | None = Field(None, alias="timeoutMs", title="Timeoutms")
    title: Title | None = Field(None, title="Title")


class TaskTry(BaseModel):
    """
    One try of a task: its job and how it ended.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    dispatched_at: AwareDatetime = Field(..., alias="dispatchedAt", title="Dispatchedat")
    error: str | None = Field(None, title="Error")
    job_attempts: int | None = Field(None, alias="jobAttempts", title="Jobattempts")
    job_id: str = Field(..., alias="jobId", title="Jobid")
    number: int = Field(..., title="Number")
    settled_at: AwareDatetime | None = Field(None, alias="settledAt", title="Settledat")
    started_at: AwareDatetime | None = Field(None, alias="startedAt", title="Startedat")
    status: Literal["pending", "dispatched", "running", "completed", "failed", "canceled"] = Field(
        "dispatched", title="Status"
    )


class Description(RootModel[str]):
    root: str = Field(None, max_length=500, title="Description")


class OrganizationId2(RootModel[str]):
    root: str = Field(None, max_length=200, min_length=1, title="Organizationid")
    """
    Admin tokens only: the organization of the webhook
    """


class WebhookCreateBody(BaseModel):
    """
    `POST /webhooks`: the URL to post to and the events it wants (validated by
    `receipts.webhooks.parse_create`, which names the field at fault, and the egress rules).
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    description: Description | None = Field(None, title="Description")
    events: list[
        Literal[
            "job.completed",
            "job.failed",
            "job.canceled",
            "session.wakeup",
            "objective.settled",
        ]
    ] = Field(..., min_length=1, title="Events")
    organization_id: OrganizationId2 | None = Field(
        None, alias="organizationId", title="Organizationid"
    )
    """
    Admin tokens only: the organization of the webhook
    """
    url: str = Field(..., max_length=2000, min_length=1, title="Url")
    """
    https (plain http only to a host on RECEIPT_WEBHOOK_ALLOWED_HOSTS); its host must resolve to public addresses only
    """


class WebhookTestAccepted(BaseModel):
    """
    A `webhook.test` delivery was owed; `GET /webhooks/{id}/deliveries` shows how it went.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    delivery_id: str = Field(..., alias="deliveryId", title="Deliveryid")
    webhook_id: str = Field(..., alias="webhookId", title="Webhookid")


class WebhookTry(BaseModel):
    """
    One try of a delivery: when, the receiver's status code or the error, how long.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    at: AwareDatetime = Field(..., title="At")
    duration_ms: int | None = Field(None, alias="durationMs", title="Durationms")
    error: str | None = Field(None, title="Error")
    status_code: int | None = Field(None, alias="statusCode", title="Statuscode")


class WebhookView(BaseModel):
    """
    A subscription (its secret is never shown again after create or rotate).
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    created_at: AwareDatetime = Field(..., alias="createdAt", title="Createdat")
    description: str | None = Field(None, title="Description")
    events: list[
        Literal[
            "job.completed",
            "job.failed",
            "job.canceled",
            "session.wakeup",
            "objective.settled",
        ]
    ] = Field(..., title="Events")
    organization_id: str = Field(..., alias="organizationId", title="Organizationid")
    secret_rotated_at: AwareDatetime | None = Field(
        None, alias="secretRotatedAt", title="Secretrotatedat"
    )
    url: str = Field(..., title="Url")
    webhook_id: str = Field(..., alias="webhookId", title="Webhookid")


class AgentJobEventsPage(BaseModel):
    """
    An agent job's receipts with `seq > after`, in order; `lastSeq` is where the next page
    starts.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    agent_job_id: str = Field(..., alias="agentJobId", title="Agentjobid")
    last_seq: int = Field(..., alias="lastSeq", title="Lastseq")
    receipts: list[ReceiptView] = Field(..., title="Receipts")
    status: str = Field(..., title="Status")
    stream: str = Field(..., title="Stream")


class AgentJobView(BaseModel):
    """
    An agent job as the API shows it: its folded state, latest status, streams and links.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    agent_id: str = Field(..., alias="agentId", title="Agentid")
    agent_job_id: str = Field(..., alias="agentJobId", title="Agentjobid")
    answer: dict[str, Any] | None = Field(None, title="Answer")
    attempt: int = Field(0, title="Attempt")
    available_at: AwareDatetime | None = Field(None, alias="availableAt", title="Availableat")
    cancel_reason: str | None = Field(None, alias="cancelReason", title="Cancelreason")
    cancel_requested: bool = Field(False, alias="cancelRequested", title="Cancelrequested")
    consecutive_failures: int = Field(0, alias="consecutiveFailures", title="Consecutivefailures")
    continued_from_job_id: str | None = Field(
        None, alias="continuedFromJobId", title="Continuedfromjobid"
    )
    created_at: AwareDatetime = Field(..., alias="createdAt", title="Createdat")
    error: str | None = Field(None, title="Error")
    follow_up: Any | None = Field(None, alias="followUp", title="Followup")
    input: dict[str, Any] = Field(..., title="Input")
    latest_status: LatestStatus = Field(..., alias="latestStatus")
    links: AgentJobLinks | None = None
    live_turn_job_id: str | None = Field(None, alias="liveTurnJobId", title="Liveturnjobid")
    organization_id: str = Field(..., alias="organizationId", title="Organizationid")
    owner_session_id: str = Field(..., alias="ownerSessionId", title="Ownersessionid")
    pending_tool_call: PendingToolCall | None = Field(None, alias="pendingToolCall")
    provider_binding: str | None = Field(None, alias="providerBinding", title="Providerbinding")
    queue_job_id: str | None = Field(None, alias="queueJobId", title="Queuejobid")
    queue_job_ids: list[str] = Field([], alias="queueJobIds", title="Queuejobids")
    reply_route: ReplyRouteModel = Field(..., alias="replyRoute")
    result: Any | None = Field(None, title="Result")
    seq: int = Field(0, title="Seq")
    session_stream: str = Field(..., alias="sessionStream", title="Sessionstream")
    settled_at: AwareDatetime | None = Field(None, alias="settledAt", title="Settledat")
    source_actor_event_id: str = Field(..., alias="sourceActorEventId", title="Sourceactoreventid")
    source_tool_call_id: str = Field(..., alias="sourceToolCallId", title="Sourcetoolcallid")
    started_at: AwareDatetime | None = Field(None, alias="startedAt", title="Startedat")
    status: Literal["queued", "running", "waiting_on_user", "succeeded", "failed", "stopped"] = (
        Field("queued", title="Status")
    )
    stream: str = Field(..., title="Stream")
    turn: int = Field(0, title="Turn")
    updated_at: AwareDatetime = Field(..., alias="updatedAt", title="Updatedat")
    usage: dict[str, int] = Field({}, title="Usage")
    user_id: str | None = Field(None, alias="userId", title="Userid")
    workspace_owner_job_id: str = Field(
        ..., alias="workspaceOwnerJobId", title="Workspaceownerjobid"
    )
    workspace_template: str | None = Field(
        None, alias="workspaceTemplate", title="Workspacetemplate"
    )


class EnqueueBody(BaseModel):
    """
    An enqueue request. Unknown top-level fields are refused (422).

    The same model validates the HTTP body and documents it (the API's OpenAPI schema).
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    delay_ms: DelayMs | None = Field(None, alias="delayMs", title="Delayms")
    job_id: JobId | None = Field(None, alias="jobId", title="Jobid")
    """
    Idempotency key of the job, scoped to the caller's organization
    """
    lane: Literal["chat", "collect", "steer", "follow_up"] | None = Field(None, title="Lane")
    max_attempts: int | None = Field(None, alias="maxAttempts", title="Maxattempts")
    """
    clamped to 1..8; default 2
    """
    payload: EnqueuePayload
    session_key: SessionKey | None = Field(None, alias="sessionKey", title="Sessionkey")
    singleton_mode: Literal["allow", "cancel", "steer"] | None = Field(
        None, alias="singletonMode", title="Singletonmode"
    )


class ErrorBody(BaseModel):
    """
    The one error shape of the API.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    error: ErrorDetail


class EventsPage(BaseModel):
    """
    A job's receipts with `seq > after`, in order; `lastSeq` is where the next page starts.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    job_id: str = Field(..., alias="jobId", title="Jobid")
    last_seq: int = Field(..., alias="lastSeq", title="Lastseq")
    receipts: list[ReceiptView] = Field(..., title="Receipts")
    status: str = Field(..., title="Status")
    stream: str = Field(..., title="Stream")


class JobView(BaseModel):
    """
    A job as the API shows it: the folded state, its stream, routing and pending commands.

    `route` is the task queue it is delivered on (agent id first, kind second);
    `contractWorkerGroup`/`contractQueue` are what its kind's contract names. They can disagree
    (docs/design.md §5); both are shown. `agentHasHandler` is false for an agent id no worker handles.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    abort_reason: str | None = Field(None, alias="abortReason", title="Abortreason")
    abort_requested: bool = Field(False, alias="abortRequested", title="Abortrequested")
    agent_has_handler: bool = Field(..., alias="agentHasHandler", title="Agenthashandler")
    agent_id: str = Field(..., alias="agentId", title="Agentid")
    attempt: int = Field(0, title="Attempt")
    available_at: AwareDatetime | None = Field(None, alias="availableAt", title="Availableat")
    canceled_reason: str | None = Field(None, alias="canceledReason", title="Canceledreason")
    commands: list[Command] = Field([], title="Commands", validate_default=True)
    contract_queue: str | None = Field(..., alias="contractQueue", title="Contractqueue")
    contract_worker_group: str | None = Field(
        ..., alias="contractWorkerGroup", title="Contractworkergroup"
    )
    created_at: AwareDatetime = Field(..., alias="createdAt", title="Createdat")
    error: str | None = Field(None, title="Error")
    job_id: str = Field(..., alias="jobId", title="Jobid")
    kind: str = Field(..., title="Kind")
    lane: str = Field(..., title="Lane")
    last_heartbeat_at: AwareDatetime | None = Field(
        None, alias="lastHeartbeatAt", title="Lastheartbeatat"
    )
    lease: Lease | None = None
    max_attempts: int = Field(2, alias="maxAttempts", title="Maxattempts")
    organization_id: str | None = Field(None, alias="organizationId", title="Organizationid")
    payload: dict[str, Any] = Field(..., title="Payload")
    pending_commands: list[Command] = Field(..., alias="pendingCommands", title="Pendingcommands")
    progress: Any | None = Field(None, title="Progress")
    progress_count: int = Field(0, alias="progressCount", title="Progresscount")
    result: Any | None = Field(None, title="Result")
    retried_as: str | None = Field(None, alias="retriedAs", title="Retriedas")
    retry_of: str | None = Field(None, alias="retryOf", title="Retryof")
    route: str = Field(..., title="Route")
    route_matches_contract: bool = Field(
        ..., alias="routeMatchesContract", title="Routematchescontract"
    )
    seq: int = Field(0, title="Seq")
    session_key: str | None = Field(None, alias="sessionKey", title="Sessionkey")
    settled_at: AwareDatetime | None = Field(None, alias="settledAt", title="Settledat")
    settlement_id: str | None = Field(None, alias="settlementId", title="Settlementid")
    singleton_mode: str = Field("allow", alias="singletonMode", title="Singletonmode")
    status: Literal["queued", "leased", "running", "completed", "failed", "canceled"] = Field(
        "queued", title="Status"
    )
    stream: str = Field(..., title="Stream")
    trace_id: str | None = Field(None, alias="traceId", title="Traceid")
    traceparent: str | None = Field(None, title="Traceparent")
    updated_at: AwareDatetime = Field(..., alias="updatedAt", title="Updatedat")


class ObjectiveAccepted(BaseModel):
    """
    The answer to an objective's creation: its id, its `factory.run` job (new, or the existing
    one for a re-post) and where to follow it.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    cancel_url: str = Field(..., alias="cancelUrl", title="Cancelurl")
    events_url: str = Field(..., alias="eventsUrl", title="Eventsurl")
    job: JobView
    job_url: str = Field(..., alias="jobUrl", title="Joburl")
    objective_id: str = Field(..., alias="objectiveId", title="Objectiveid")
    objective_url: str = Field(..., alias="objectiveUrl", title="Objectiveurl")
    outcome: Literal["created", "existing", "steered"] = Field(..., title="Outcome")


class Tasks(RootModel[list[TaskBody]]):
    root: list[TaskBody] = Field(None, max_length=200, min_length=1, title="Tasks")


class ObjectiveBody(BaseModel):
    """
    `POST /objectives`: a written goal and, unless the planner supplies them, its tasks.

    `authContext` may be left out by a token of an organization (the token's is used).
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    auth_context: AuthContext | None = Field(None, alias="authContext")
    goal: str = Field(..., max_length=20000, min_length=1, title="Goal")
    objective_id: ObjectiveId | None = Field(None, alias="objectiveId", title="Objectiveid")
    publish: StepBody | None = None
    tasks: Tasks | None = Field(None, title="Tasks")
    title: str = Field(..., max_length=20000, min_length=1, title="Title")
    validate_: StepBody | None = Field(None, alias="validate")


class ObjectiveEventsPage(BaseModel):
    """
    An objective's receipts with `seq > after`, in order; `lastSeq` is where the next page
    starts.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    last_seq: int = Field(..., alias="lastSeq", title="Lastseq")
    objective_id: str = Field(..., alias="objectiveId", title="Objectiveid")
    receipts: list[ReceiptView] = Field(..., title="Receipts")
    status: Literal["active", "completed", "failed", "canceled"] = Field(..., title="Status")
