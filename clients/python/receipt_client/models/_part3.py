# The API's schemas as pydantic models, generated from clients/python/openapi.json by
# `make client` (tools/client_models.py, datamodel-code-generator): do not edit by hand.

from __future__ import annotations

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, RootModel
from typing import Any, Literal
from receipt_client.models._part1 import *
from receipt_client.models._part2 import *


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
