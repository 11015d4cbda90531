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
    idempotency_mismatch: bool = Field(
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
    limit: int = Field(100, ge=1, le=500, title="Limit")
    organization_id: OrganizationId1 | None = Field(
        None, alias="organizationId", title="Organizationid"
    )
    status: Literal["failed", "canceled"] = Field("failed", title="Status")


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
    from_enqueue: bool = Field(False, alias="fromEnqueue", title="Fromenqueue")
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
    payload: Any = Field(None, title="Payload")
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


class Firing(BaseModel):
    """
    One fire time and what it came to: the job it enqueued, or why it enqueued none.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    canceled_job_id: str | None = Field(None, alias="canceledJobId", title="Canceledjobid")
    fire_time: AwareDatetime = Field(..., alias="fireTime", title="Firetime")
    job_id: str | None = Field(None, alias="jobId", title="Jobid")
    outcome: Literal["enqueued", "skipped"] = Field(..., title="Outcome")
    reason: str | None = Field(None, title="Reason")
    recorded_at: AwareDatetime = Field(..., alias="recordedAt", title="Recordedat")
    running_job_id: str | None = Field(None, alias="runningJobId", title="Runningjobid")


class Health(BaseModel):
    """
    The process is up.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    status: Literal["ok"] = Field(..., title="Status")
