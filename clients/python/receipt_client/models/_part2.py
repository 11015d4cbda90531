# The API's schemas as pydantic models, generated from clients/python/openapi.json by
# `make client` (tools/client_models.py, datamodel-code-generator): do not edit by hand.

from __future__ import annotations

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, RootModel
from typing import Any, Literal
from receipt_client.models._part1 import *


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


class Cron(RootModel[str]):
    root: str = Field(
        None, examples=["*/15 * * * *", "0 9 * * mon-fri"], max_length=200, title="Cron"
    )


class Interval(RootModel[str]):
    root: str = Field(
        None,
        examples=["30s", "1h"],
        max_length=200,
        pattern="^\\d+[smhd]$",
        title="Interval",
    )


class ScheduleId(RootModel[str]):
    root: str = Field(None, pattern="^[A-Za-z0-9._@-]{1,120}$", title="Scheduleid")


class ScheduleBody(BaseModel):
    """
    `POST /schedules`: when it fires (a five-field `cron` in `timezone`, or an `interval` such
    as `15m`), the enqueue body each firing posts to `agentId` (its job id is
    `<scheduleId>:<fire time>`), and what a firing does while the previous job is still active.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    agent_id: str = Field(..., alias="agentId", min_length=1, title="Agentid")
    cron: Cron | None = Field(None, examples=["*/15 * * * *", "0 9 * * mon-fri"], title="Cron")
    interval: Interval | None = Field(None, examples=["30s", "1h"], title="Interval")
    job: dict[str, Any] = Field(..., title="Job")
    """
    The enqueue body (as POST /agents/{agentId}/jobs)
    """
    overlap: Literal["skip", "allow", "cancel_previous"] = Field("skip", title="Overlap")
    paused: bool = Field(False, title="Paused")
    schedule_id: ScheduleId | None = Field(None, alias="scheduleId", title="Scheduleid")
    timezone: str = Field("UTC", examples=["Europe/Paris"], max_length=200, title="Timezone")


class AgentId1(RootModel[str]):
    root: str = Field(None, min_length=1, title="Agentid")


class Cron1(RootModel[str]):
    root: str = Field(None, max_length=200, title="Cron")


class Interval1(RootModel[str]):
    root: str = Field(None, max_length=200, pattern="^\\d+[smhd]$", title="Interval")


class Note(RootModel[str]):
    root: str = Field(None, max_length=1000, title="Note")


class Timezone(RootModel[str]):
    root: str = Field(None, max_length=200, title="Timezone")


class SchedulePatchBody(BaseModel):
    """
    `PATCH /schedules/{scheduleId}`: pause or resume it, or change when it fires or what;
    a field left out keeps its value (`cron` and `interval` replace each other).
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    agent_id: AgentId1 | None = Field(None, alias="agentId", title="Agentid")
    cron: Cron1 | None = Field(None, title="Cron")
    interval: Interval1 | None = Field(None, title="Interval")
    job: dict[str, Any] | None = Field(None, title="Job")
    note: Note | None = Field(None, title="Note")
    overlap: Literal["skip", "allow", "cancel_previous"] | None = Field(None, title="Overlap")
    paused: bool | None = Field(None, title="Paused")
    timezone: Timezone | None = Field(None, title="Timezone")


class ScheduleRun(BaseModel):
    """
    One recent firing: its fire time, what it came to and its job's status now.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    canceled_job_id: str | None = Field(None, alias="canceledJobId", title="Canceledjobid")
    fire_time: AwareDatetime = Field(..., alias="fireTime", title="Firetime")
    job_id: str | None = Field(None, alias="jobId", title="Jobid")
    job_status: Literal["queued", "leased", "running", "completed", "failed", "canceled"] | None = (
        Field(None, alias="jobStatus", title="Jobstatus")
    )
    outcome: Literal["enqueued", "skipped"] = Field(..., title="Outcome")
    reason: str | None = Field(None, title="Reason")
    recorded_at: AwareDatetime = Field(..., alias="recordedAt", title="Recordedat")
    running_job_id: str | None = Field(None, alias="runningJobId", title="Runningjobid")


class ScheduleView(BaseModel):
    """
    A schedule: its definition, whether it is paused, its next fire times (none while paused)
    and its last firings with their jobs.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    agent_id: str = Field(..., alias="agentId", title="Agentid")
    caller_schedule_id: str = Field(..., alias="callerScheduleId", title="Callerscheduleid")
    created_at: AwareDatetime = Field(..., alias="createdAt", title="Createdat")
    cron: str | None = Field(None, title="Cron")
    definition_seq: int = Field(..., alias="definitionSeq", title="Definitionseq")
    fired: int = Field(0, title="Fired")
    interval_s: int | None = Field(None, alias="intervalS", title="Intervals")
    job: dict[str, Any] = Field(..., title="Job")
    last_job_id: str | None = Field(None, alias="lastJobId", title="Lastjobid")
    last_runs: list[ScheduleRun] = Field(..., alias="lastRuns", title="Lastruns")
    latest_fire_time: AwareDatetime | None = Field(
        None, alias="latestFireTime", title="Latestfiretime"
    )
    next_fire_times: list[AwareDatetime] = Field(..., alias="nextFireTimes", title="Nextfiretimes")
    note: str = Field("", title="Note")
    organization_id: str | None = Field(..., alias="organizationId", title="Organizationid")
    overlap: Literal["skip", "allow", "cancel_previous"] = Field("skip", title="Overlap")
    recent: list[Firing] = Field([], title="Recent", validate_default=True)
    schedule_id: str = Field(..., alias="scheduleId", title="Scheduleid")
    seq: int = Field(0, title="Seq")
    settled_at: AwareDatetime | None = Field(None, alias="settledAt", title="Settledat")
    skipped: int = Field(0, title="Skipped")
    status: Literal["active", "paused", "deleted"] = Field(..., title="Status")
    stream: str = Field(..., title="Stream")
    timezone: str = Field("UTC", title="Timezone")
    updated_at: AwareDatetime = Field(..., alias="updatedAt", title="Updatedat")


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
    output_lines: int = Field(0, alias="outputLines", title="Outputlines")
    phase: int | None = Field(None, title="Phase")
    settled_at: AwareDatetime | None = Field(None, alias="settledAt", title="Settledat")
    started_at: AwareDatetime | None = Field(None, alias="startedAt", title="Startedat")
    status: Literal["pending", "dispatched", "running", "completed", "failed", "canceled"] = Field(
        "pending", title="Status"
    )


class TimeoutMs(RootModel[int]):
    root: int = Field(None, gt=0, title="Timeoutms")


class Title(RootModel[str]):
    root: str = Field(None, max_length=20000, title="Title")
