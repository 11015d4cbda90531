# The API's schemas as pydantic models, generated from clients/python/openapi.json by
# `make client` (tools/client_models.py, datamodel-code-generator): do not edit by hand.

from __future__ import annotations

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, RootModel
from typing import Any, Literal


class AgentJobCancelBody(BaseModel):
    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    reason: str | None = Field(None, max_length=1000)


class ContinuedFromJobId(RootModel[str]):
    root: str = Field(..., max_length=200, min_length=1)


class Input(BaseModel):
    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    command: list[str] | None = Field(None, min_length=1)
    prompt: str | None = Field(None, min_length=1)


class OrganizationId(RootModel[str]):
    root: str = Field(..., max_length=200, min_length=1)
    """
    Admin tokens only: the organization of the job
    """


class ProviderBinding(RootModel[str]):
    root: str = Field(..., max_length=200, min_length=1)


class ReplyRoute(BaseModel):
    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    binding: str = Field(..., min_length=1)
    channel: str = Field(..., min_length=1)
    thread: str | None = None


class UserId(RootModel[str]):
    root: str = Field(..., max_length=200, min_length=1)


class AgentJobCreateBody(BaseModel):
    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    agent_id: str = Field(..., alias="agentId", max_length=200, min_length=1)
    continued_from_job_id: ContinuedFromJobId | None = Field(None, alias="continuedFromJobId")
    input: Input
    organization_id: OrganizationId | None = Field(None, alias="organizationId")
    """
    Admin tokens only: the organization of the job
    """
    owner_session_id: str = Field(..., alias="ownerSessionId", max_length=200, min_length=1)
    provider_binding: ProviderBinding | None = Field(None, alias="providerBinding")
    reply_route: ReplyRoute = Field(..., alias="replyRoute")
    source_actor_event_id: str = Field(
        ..., alias="sourceActorEventId", max_length=200, min_length=1
    )
    source_tool_call_id: str = Field(..., alias="sourceToolCallId", max_length=200, min_length=1)
    user_id: UserId | None = Field(None, alias="userId")
    workspace_template: str | None = Field(None, alias="workspaceTemplate")


class ToolCallId(RootModel[str]):
    root: str = Field(..., max_length=200, min_length=1)


class AgentJobInputBody(BaseModel):
    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    answer: Any
    tool_call_id: ToolCallId | None = Field(None, alias="toolCallId")


class AgentJobLinks(BaseModel):
    """
    Where to read, follow and answer an agent job (`turnJob`: its current turn's queue job).
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    events: str = Field(..., title="Events")
    input: str = Field(..., title="Input")
    self: str = Field(..., title="Self")
    session_events: str = Field(..., alias="sessionEvents", title="Sessionevents")
    turn_job: str | None = Field(..., alias="turnJob", title="Turnjob")


class AgentJobStreamEnd(BaseModel):
    """
    The data of an agent job stream's `end` event: the job is finished.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    agent_job_id: str = Field(..., alias="agentJobId", title="Agentjobid")
    status: Literal["queued", "running", "waiting_on_user", "succeeded", "failed", "stopped"] = (
        Field(..., title="Status")
    )


class AgentJobTurn(BaseModel):
    """
    One turn of an agent job: its queue job and how it ended (None while it has not).
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    error: str | None = Field(..., title="Error")
    job_id: str = Field(..., alias="jobId", title="Jobid")
    result: Any | None = Field(None, title="Result")
    status: str | None = Field(..., title="Status")
    stream: str = Field(..., title="Stream")


class AsyncInfo(BaseModel):
    """
    Where to follow an accepted job.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    events_url: str = Field(..., alias="eventsUrl", title="Eventsurl")
    idempotency_mismatch: bool | None = Field(
        False, alias="idempotencyMismatch", title="Idempotencymismatch"
    )
    """
    True when a re-post named an existing job with another agent or payload: the existing job is returned unchanged, as for any re-post
    """
    job_id: str = Field(..., alias="jobId", title="Jobid")
    job_url: str = Field(..., alias="jobUrl", title="Joburl")
    status: str = Field(..., title="Status")
    stream: str = Field(..., title="Stream")


class ReceiptConnectGatewayUrl(RootModel[str]):
    root: str = Field(None, max_length=2048, title="Receiptconnectgatewayurl")


class SessionId(RootModel[str]):
    root: str = Field(None, max_length=200, title="Sessionid")


class Source(RootModel[str]):
    root: str = Field(None, max_length=200, title="Source")


class WorkspaceId(RootModel[str]):
    root: str = Field(None, max_length=200, title="Workspaceid")


class AuthContext(BaseModel):
    """
    Who the job acts for: `userId` and `organizationId` (non-blank), four optional strings.

    A strict schema: any other key is refused, so nothing unchecked rides along to
    the handlers. `receiptConnectGatewayUrl` is checked against the operator's allow-list by the
    API (`RECEIPT_GATEWAY_URL_ALLOWLIST`), not here: the domain does not know the deployment.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    organization_id: str = Field(
        ...,
        alias="organizationId",
        max_length=200,
        pattern="\\S",
        title="Organizationid",
    )
    receipt_connect_gateway_url: ReceiptConnectGatewayUrl | None = Field(
        None, alias="receiptConnectGatewayUrl", title="Receiptconnectgatewayurl"
    )
    session_id: SessionId | None = Field(None, alias="sessionId", title="Sessionid")
    source: Source | None = Field(None, title="Source")
    user_id: str = Field(..., alias="userId", max_length=200, pattern="\\S", title="Userid")
    workspace_id: WorkspaceId | None = Field(None, alias="workspaceId", title="Workspaceid")


class BulkRetried(BaseModel):
    """
    What a bulk retry created: one entry per job retried (`jobId` → `retryJobId`).
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    count: int = Field(..., title="Count")
    retried: list[dict[str, str]] = Field(..., title="Retried")


class AgentId(RootModel[str]):
    root: str = Field(None, max_length=200, min_length=1, title="Agentid")


class Error(RootModel[str]):
    root: str = Field(None, max_length=2000, min_length=1, title="Error")


class Kind(RootModel[str]):
    root: str = Field(None, max_length=200, min_length=1, title="Kind")


class Lane(RootModel[str]):
    root: str = Field(None, max_length=20, min_length=1, title="Lane")


class OrganizationId1(RootModel[str]):
    root: str = Field(None, max_length=200, min_length=1, title="Organizationid")


class BulkRetryBody(BaseModel):
    """
    Which settled jobs to retry: a filter (null matches all) and a bound.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    agent_id: AgentId | None = Field(None, alias="agentId", title="Agentid")
    error: Error | None = Field(None, title="Error")
    kind: Kind | None = Field(None, title="Kind")
    lane: Lane | None = Field(None, title="Lane")
    limit: int | None = Field(100, ge=1, le=500, title="Limit")
    organization_id: OrganizationId1 | None = Field(
        None, alias="organizationId", title="Organizationid"
    )
    status: Literal["failed", "canceled"] | None = Field("failed", title="Status")


class Command(BaseModel):
    """
    A queue command as the state keeps it: a reference to its `queue.command` receipt (`seq`)
    and small metadata, never the payload (receipts/commands.py reads it).
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    command_id: str = Field(..., alias="commandId", title="Commandid")
    consumed_attempt: int | None = Field(None, alias="consumedAttempt", title="Consumedattempt")
    from_enqueue: bool | None = Field(False, alias="fromEnqueue", title="Fromenqueue")
    from_session_key: str | None = Field(None, alias="fromSessionKey", title="Fromsessionkey")
    lane: str | None = Field(None, title="Lane")
    reason: str | None = Field(None, title="Reason")
    recorded_at: AwareDatetime = Field(..., alias="recordedAt", title="Recordedat")
    seq: int | None = Field(None, title="Seq")
    type: str = Field(..., title="Type")
    unconsumed: str | None = Field(None, title="Unconsumed")


class Reason(RootModel[str]):
    root: str = Field(None, max_length=4096, title="Reason")


class CommandBody(BaseModel):
    """
    A queue command for a job that is not terminal (validates the body and documents it).
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    payload: Any | None = Field(None, title="Payload")
    reason: Reason | None = Field(None, title="Reason")
    type: Literal["steer", "follow_up", "abort"] = Field(..., title="Type")


class CommandInput(BaseModel):
    """
    A task that runs a command: its argv, no shell unless the argv asks for one.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    command: list[str] = Field(..., min_length=1, title="Command")


class DelayMs(RootModel[int]):
    root: int = Field(None, ge=0, le=604800000, title="Delayms")


class JobId(RootModel[str]):
    root: str = Field(None, pattern="^[A-Za-z0-9._:@-]{1,200}$", title="Jobid")
    """
    Idempotency key of the job, scoped to the caller's organization
    """


class SessionKey(RootModel[str]):
    root: str = Field(None, max_length=200, pattern="\\S", title="Sessionkey")


class EnqueuePayload(BaseModel):
    """
    A job's input: its `kind` (one of nine), `authContext` (every kind but the watchdog), more.

    Fields other than these two are the handler's and pass through unchanged.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    auth_context: AuthContext | None = Field(None, alias="authContext")
    """
    Required for every kind but factory.objective.watchdog
    """
    kind: Literal[
        "factory.dispatch",
        "factory.run",
        "factory.integration.publish",
        "factory.integration.validate",
        "factory.objective.audit",
        "factory.objective.control",
        "factory.objective.watchdog",
        "factory.task.monitor",
        "factory.task.run",
    ] = Field(..., title="Kind")


class ErrorDetail(BaseModel):
    """
    What went wrong: a stable `code`, a readable `message`, the field at fault and its choices.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    allowed: list[str] | None = Field(None, title="Allowed")
    code: str = Field(..., title="Code")
    field: str | None = Field(None, title="Field")
    message: str = Field(..., title="Message")


class Health(BaseModel):
    """
    The process is up.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    status: Literal["ok"] = Field(..., title="Status")


class JobStreamEnd(BaseModel):
    """
    The data of a job stream's `end` event: the job is terminal.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    job_id: str = Field(..., alias="jobId", title="Jobid")
    status: Literal["queued", "leased", "running", "completed", "failed", "canceled"] = Field(
        ..., title="Status"
    )


class LatestStatus(BaseModel):
    """
    The latest-status projection: `interrupted` / `request_user_input` while the job waits on
    its user, else its status.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    answered: bool | None = Field(None, title="Answered")
    error_code: str | None = Field(..., alias="errorCode", title="Errorcode")
    pending_tool_call: dict[str, Any] | None = Field(
        ..., alias="pendingToolCall", title="Pendingtoolcall"
    )
    state: str = Field(..., title="State")


class Lease(BaseModel):
    """
    The active fence: one delivery (`workerId`) of one attempt, valid until `expiresAt`.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    attempt: int = Field(..., title="Attempt")
    expires_at: AwareDatetime = Field(..., alias="expiresAt", title="Expiresat")
    leased_at: AwareDatetime = Field(..., alias="leasedAt", title="Leasedat")
    process: dict[str, Any] | None = Field(None, title="Process")
    worker_id: str = Field(..., alias="workerId", title="Workerid")


class ObjectiveId(RootModel[str]):
    model_config = ConfigDict(
        regex_engine="python-re",
    )
    root: str = Field(None, pattern="^(?!\\.\\.?$)[A-Za-z0-9._@-]{1,100}$", title="Objectiveid")


class ObjectiveCancelAccepted(BaseModel):
    """
    A cancel was recorded: control aborts the objective's running jobs and settles it.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    cancel_requested: bool = Field(..., alias="cancelRequested", title="Cancelrequested")
    objective_id: str = Field(..., alias="objectiveId", title="Objectiveid")
    status: Literal["active", "completed", "failed", "canceled"] = Field(..., title="Status")


class ObjectiveCancelBody(BaseModel):
    """
    `POST /objectives/{objectiveId}/cancel` (the body may be left out).
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    reason: str | None = Field(None, title="Reason")


class ObjectiveStreamEnd(BaseModel):
    """
    The data of an objective stream's `end` event: it is settled and audited.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    objective_id: str = Field(..., alias="objectiveId", title="Objectiveid")
    status: Literal["active", "completed", "failed", "canceled"] = Field(..., title="Status")


class ObjectiveSummary(BaseModel):
    """
    One objective in a list: its status, phase and how many of its tasks completed.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    completed_tasks: int = Field(..., alias="completedTasks", title="Completedtasks")
    created_at: AwareDatetime = Field(..., alias="createdAt", title="Createdat")
    error: str | None = Field(..., title="Error")
    objective_id: str = Field(..., alias="objectiveId", title="Objectiveid")
    organization_id: str = Field(..., alias="organizationId", title="Organizationid")
    phase: int = Field(..., title="Phase")
    status: Literal["active", "completed", "failed", "canceled"] = Field(..., title="Status")
    tasks: int = Field(..., title="Tasks")
    title: str = Field(..., title="Title")
    updated_at: AwareDatetime = Field(..., alias="updatedAt", title="Updatedat")


class PendingToolCall(BaseModel):
    """
    The question a waiting job asked, under the tool call id the answer must name.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    question: str = Field(..., title="Question")
    tool_call_id: str = Field(..., alias="toolCallId", title="Toolcallid")


class PromptInput(BaseModel):
    """
    A task that runs the coding agent (`RECEIPT_CODEX_COMMAND`) with this prompt on stdin.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    prompt: str = Field(..., max_length=20000, min_length=1, title="Prompt")


class Ready(BaseModel):
    """
    The database is reachable and every migration this code ships is applied.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    schema_version: int = Field(..., alias="schemaVersion", title="Schemaversion")
    status: Literal["ready"] = Field(..., title="Status")


class ReceiptView(BaseModel):
    """
    One receipt of a job's stream.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    data: dict[str, Any] = Field(..., title="Data")
    position: int = Field(..., title="Position")
    recorded_at: AwareDatetime = Field(..., alias="recordedAt", title="Recordedat")
    seq: int = Field(..., title="Seq")
    stream: str = Field(..., title="Stream")
    type: str = Field(..., title="Type")


class ReplyRouteModel(BaseModel):
    """
    Where the owner hears back: binding, channel, thread.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    binding: str = Field(..., title="Binding")
    channel: str = Field(..., title="Channel")
    thread: str | None = Field(None, title="Thread")


class SessionEventsPage(BaseModel):
    """
    An owner session's receipts (its wakeups) with `seq > after`, in order.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    last_seq: int = Field(..., alias="lastSeq", title="Lastseq")
    receipts: list[ReceiptView] = Field(..., title="Receipts")
    session_id: str = Field(..., alias="sessionId", title="Sessionid")
    stream: str = Field(..., title="Stream")


class StepBody(BaseModel):
    """
    The validate or publish step: one command run in the objective's workspace.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    command: list[str] = Field(..., min_length=1, title="Command")


class StepState(BaseModel):
    """
    The validate or publish step.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    command: list[str] = Field(..., title="Command")
    dispatched_at: AwareDatetime | None = Field(None, alias="dispatchedAt", title="Dispatchedat")
    error: str | None = Field(None, title="Error")
    job_id: str | None = Field(None, alias="jobId", title="Jobid")
    last_output: str | None = Field(None, alias="lastOutput", title="Lastoutput")
    name: str = Field(..., title="Name")
    output_lines: int | None = Field(0, alias="outputLines", title="Outputlines")
    settled_at: AwareDatetime | None = Field(None, alias="settledAt", title="Settledat")
    started_at: AwareDatetime | None = Field(None, alias="startedAt", title="Startedat")
    status: (
        Literal["pending", "dispatched", "running", "completed", "failed", "canceled"] | None
    ) = Field("pending", title="Status")


class TimeoutMs(RootModel[int]):
    root: int = Field(None, gt=0, title="Timeoutms")


class Title(RootModel[str]):
    root: str = Field(None, max_length=20000, title="Title")


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
    execution_path: Literal["local", "computer"] | None = Field(
        "local", alias="executionPath", title="Executionpath"
    )
    input: CommandInput | PromptInput = Field(..., title="Input")
    max_attempts: int | None = Field(1, alias="maxAttempts", ge=1, le=8, title="Maxattempts")
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
    status: (
        Literal["pending", "dispatched", "running", "completed", "failed", "canceled"] | None
    ) = Field("dispatched", title="Status")


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
    attempt: int | None = Field(0, title="Attempt")
    available_at: AwareDatetime | None = Field(None, alias="availableAt", title="Availableat")
    cancel_reason: str | None = Field(None, alias="cancelReason", title="Cancelreason")
    cancel_requested: bool | None = Field(False, alias="cancelRequested", title="Cancelrequested")
    consecutive_failures: int | None = Field(
        0, alias="consecutiveFailures", title="Consecutivefailures"
    )
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
    queue_job_ids: list[str] | None = Field([], alias="queueJobIds", title="Queuejobids")
    reply_route: ReplyRouteModel = Field(..., alias="replyRoute")
    result: Any | None = Field(None, title="Result")
    seq: int | None = Field(0, title="Seq")
    session_stream: str = Field(..., alias="sessionStream", title="Sessionstream")
    settled_at: AwareDatetime | None = Field(None, alias="settledAt", title="Settledat")
    source_actor_event_id: str = Field(..., alias="sourceActorEventId", title="Sourceactoreventid")
    source_tool_call_id: str = Field(..., alias="sourceToolCallId", title="Sourcetoolcallid")
    started_at: AwareDatetime | None = Field(None, alias="startedAt", title="Startedat")
    status: (
        Literal["queued", "running", "waiting_on_user", "succeeded", "failed", "stopped"] | None
    ) = Field("queued", title="Status")
    stream: str = Field(..., title="Stream")
    turn: int | None = Field(0, title="Turn")
    updated_at: AwareDatetime = Field(..., alias="updatedAt", title="Updatedat")
    usage: dict[str, int] | None = Field({}, title="Usage")
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
    abort_requested: bool | None = Field(False, alias="abortRequested", title="Abortrequested")
    agent_has_handler: bool = Field(..., alias="agentHasHandler", title="Agenthashandler")
    agent_id: str = Field(..., alias="agentId", title="Agentid")
    attempt: int | None = Field(0, title="Attempt")
    available_at: AwareDatetime | None = Field(None, alias="availableAt", title="Availableat")
    canceled_reason: str | None = Field(None, alias="canceledReason", title="Canceledreason")
    commands: list[Command] | None = Field([], title="Commands", validate_default=True)
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
    max_attempts: int | None = Field(2, alias="maxAttempts", title="Maxattempts")
    organization_id: str | None = Field(None, alias="organizationId", title="Organizationid")
    payload: dict[str, Any] = Field(..., title="Payload")
    pending_commands: list[Command] = Field(..., alias="pendingCommands", title="Pendingcommands")
    progress: Any | None = Field(None, title="Progress")
    progress_count: int | None = Field(0, alias="progressCount", title="Progresscount")
    result: Any | None = Field(None, title="Result")
    retried_as: str | None = Field(None, alias="retriedAs", title="Retriedas")
    retry_of: str | None = Field(None, alias="retryOf", title="Retryof")
    route: str = Field(..., title="Route")
    route_matches_contract: bool = Field(
        ..., alias="routeMatchesContract", title="Routematchescontract"
    )
    seq: int | None = Field(0, title="Seq")
    session_key: str | None = Field(None, alias="sessionKey", title="Sessionkey")
    settled_at: AwareDatetime | None = Field(None, alias="settledAt", title="Settledat")
    settlement_id: str | None = Field(None, alias="settlementId", title="Settlementid")
    singleton_mode: str | None = Field("allow", alias="singletonMode", title="Singletonmode")
    status: Literal["queued", "leased", "running", "completed", "failed", "canceled"] | None = (
        Field("queued", title="Status")
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


class ObjectiveList(BaseModel):
    """
    One page of objectives, newest first; pass `nextCursor` as `cursor` for the next page.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    next_cursor: str | None = Field(..., alias="nextCursor", title="Nextcursor")
    objectives: list[ObjectiveSummary] = Field(..., title="Objectives")


class ObjectiveTaskView(BaseModel):
    """
    A task as an objective's view shows it: its state, and its current try's job.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    agent_id: str = Field(..., alias="agentId", title="Agentid")
    attempt: int = Field(..., title="Attempt")
    """
    Tries so far
    """
    canceled_reason: str | None = Field(None, alias="canceledReason", title="Canceledreason")
    depends_on: list[str] | None = Field([], alias="dependsOn", title="Dependson")
    error: str | None = Field(None, title="Error")
    execution_path: str | None = Field("local", alias="executionPath", title="Executionpath")
    input: dict[str, Any] = Field(..., title="Input")
    job_id: str | None = Field(None, alias="jobId", title="Jobid")
    job_status: str | None = Field(None, alias="jobStatus", title="Jobstatus")
    """
    The current try's job's status
    """
    last_output: str | None = Field(None, alias="lastOutput", title="Lastoutput")
    max_attempts: int | None = Field(1, alias="maxAttempts", title="Maxattempts")
    output_lines: int | None = Field(0, alias="outputLines", title="Outputlines")
    phase: int | None = Field(1, title="Phase")
    status: (
        Literal["pending", "dispatched", "running", "completed", "failed", "canceled"] | None
    ) = Field("pending", title="Status")
    task_id: str = Field(..., alias="taskId", title="Taskid")
    timeout_ms: int | None = Field(None, alias="timeoutMs", title="Timeoutms")
    title: str = Field(..., title="Title")
    tries: list[TaskTry] | None = Field([], title="Tries", validate_default=True)


class ObjectiveView(BaseModel):
    """
    The folded objective: phase, task graph, each task's status, tries and job.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    audit: dict[str, Any] | None = Field(None, title="Audit")
    audit_job_id: str | None = Field(None, alias="auditJobId", title="Auditjobid")
    auth_context: dict[str, Any] = Field(..., alias="authContext", title="Authcontext")
    cancel_reason: str | None = Field(None, alias="cancelReason", title="Cancelreason")
    cancel_requested: bool | None = Field(False, alias="cancelRequested", title="Cancelrequested")
    control_delivered_seq: int | None = Field(
        0, alias="controlDeliveredSeq", title="Controldeliveredseq"
    )
    control_job_id: str | None = Field(None, alias="controlJobId", title="Controljobid")
    control_requested_seq: int | None = Field(
        0, alias="controlRequestedSeq", title="Controlrequestedseq"
    )
    created_at: AwareDatetime = Field(..., alias="createdAt", title="Createdat")
    error: str | None = Field(None, title="Error")
    failed_step: str | None = Field(None, alias="failedStep", title="Failedstep")
    failed_task: str | None = Field(None, alias="failedTask", title="Failedtask")
    goal: str = Field(..., title="Goal")
    last_control_reason: str | None = Field(
        None, alias="lastControlReason", title="Lastcontrolreason"
    )
    objective_id: str = Field(..., alias="objectiveId", title="Objectiveid")
    organization_id: str = Field(..., alias="organizationId", title="Organizationid")
    phase: int | None = Field(1, title="Phase")
    planned: bool | None = Field(False, title="Planned")
    publish_step: StepState | None = Field(None, alias="publishStep")
    reconciled_seq: int | None = Field(0, alias="reconciledSeq", title="Reconciledseq")
    run_job_id: str | None = Field(None, alias="runJobId", title="Runjobid")
    seq: int | None = Field(0, title="Seq")
    settled_at: AwareDatetime | None = Field(None, alias="settledAt", title="Settledat")
    status: Literal["active", "completed", "failed", "canceled"] | None = Field(
        "active", title="Status"
    )
    stream: str = Field(..., title="Stream")
    tasks: list[ObjectiveTaskView] | None = Field([], title="Tasks", validate_default=True)
    title: str = Field(..., title="Title")
    updated_at: AwareDatetime = Field(..., alias="updatedAt", title="Updatedat")
    validate_step: StepState | None = Field(None, alias="validateStep")


class RetryAccepted(BaseModel):
    """
    A retry: the job retried and the job its retry created (`outcome`: `retried`, or
    `already_retried` when an earlier retry had created it).
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    job: JobView
    outcome: Literal["retried", "already_retried"] = Field(..., title="Outcome")
    retry: JobView


class AgentJobAnswer(BaseModel):
    """
    An agent job after a create (201 new, 200 the existing one), an answer or a cancel.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    agent_job: AgentJobView = Field(..., alias="agentJob")
    created: bool | None = Field(None, title="Created")


class AgentJobDetail(BaseModel):
    """
    The console's view of an agent job: its state, its turns' queue jobs, the wakeups it
    wrote to its owner session and its receipts.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    agent_job: AgentJobView = Field(..., alias="agentJob")
    receipts: list[ReceiptView] = Field(..., title="Receipts")
    turns: list[AgentJobTurn] = Field(..., title="Turns")
    wakeups: list[ReceiptView] = Field(..., title="Wakeups")


class AgentJobList(BaseModel):
    """
    One page of agent jobs; pass `nextCursor` as `cursor` for the next page.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    agent_jobs: list[AgentJobView] = Field(..., alias="agentJobs", title="Agentjobs")
    next_cursor: str | None = Field(..., alias="nextCursor", title="Nextcursor")


class CommandAccepted(BaseModel):
    """
    A command appended to a job's stream.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    command_id: str = Field(..., alias="commandId", title="Commandid")
    job: JobView
    job_id: str = Field(..., alias="jobId", title="Jobid")
    read_by_handler: bool = Field(..., alias="readByHandler", title="Readbyhandler")
    """
    Whether this job's handler reads a command of this type (an abort always stops it); one it does not is settled queue.command.unconsumed when the job ends
    """
    type: str = Field(..., title="Type")


class EnqueueAccepted(BaseModel):
    """
    The answer to an enqueue: the job (new, existing or steered) and where to follow it.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    async_: AsyncInfo = Field(..., alias="async")
    job: JobView
    outcome: Literal["created", "existing", "steered"] = Field(..., title="Outcome")


class JobList(BaseModel):
    """
    One page of jobs, newest first; pass `nextCursor` as `cursor` for the next page.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    jobs: list[JobView] = Field(..., title="Jobs")
    next_cursor: str | None = Field(..., alias="nextCursor", title="Nextcursor")
