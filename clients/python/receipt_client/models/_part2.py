# The API's schemas as pydantic models, generated from clients/python/openapi.json by
# `make client` (tools/client_models.py, datamodel-code-generator): do not edit by hand.

from __future__ import annotations

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, RootModel
from typing import Any, Literal
from receipt_client.models._part1 import *


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
