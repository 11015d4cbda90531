# The API's schemas as pydantic models, generated from clients/python/openapi.json by
# `make client` (tools/client_models.py, datamodel-code-generator): do not edit by hand.

from __future__ import annotations

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field
from typing import Any, Literal
from receipt_client.models._part1 import *
from receipt_client.models._part2 import *
from receipt_client.models._part3 import *


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
    depends_on: list[str] = Field([], alias="dependsOn", title="Dependson")
    error: str | None = Field(None, title="Error")
    execution_path: str = Field("local", alias="executionPath", title="Executionpath")
    input: dict[str, Any] = Field(..., title="Input")
    job_id: str | None = Field(None, alias="jobId", title="Jobid")
    job_status: str | None = Field(None, alias="jobStatus", title="Jobstatus")
    """
    The current try's job's status
    """
    last_output: str | None = Field(None, alias="lastOutput", title="Lastoutput")
    max_attempts: int = Field(1, alias="maxAttempts", title="Maxattempts")
    output_lines: int = Field(0, alias="outputLines", title="Outputlines")
    phase: int = Field(1, title="Phase")
    status: Literal["pending", "dispatched", "running", "completed", "failed", "canceled"] = Field(
        "pending", title="Status"
    )
    task_id: str = Field(..., alias="taskId", title="Taskid")
    timeout_ms: int | None = Field(None, alias="timeoutMs", title="Timeoutms")
    title: str = Field(..., title="Title")
    tries: list[TaskTry] = Field([], title="Tries", validate_default=True)


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
    cancel_requested: bool = Field(False, alias="cancelRequested", title="Cancelrequested")
    control_delivered_seq: int = Field(0, alias="controlDeliveredSeq", title="Controldeliveredseq")
    control_job_id: str | None = Field(None, alias="controlJobId", title="Controljobid")
    control_requested_seq: int = Field(0, alias="controlRequestedSeq", title="Controlrequestedseq")
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
    phase: int = Field(1, title="Phase")
    planned: bool = Field(False, title="Planned")
    publish_step: StepState | None = Field(None, alias="publishStep")
    reconciled_seq: int = Field(0, alias="reconciledSeq", title="Reconciledseq")
    run_job_id: str | None = Field(None, alias="runJobId", title="Runjobid")
    seq: int = Field(0, title="Seq")
    settled_at: AwareDatetime | None = Field(None, alias="settledAt", title="Settledat")
    status: Literal["active", "completed", "failed", "canceled"] = Field("active", title="Status")
    stream: str = Field(..., title="Stream")
    tasks: list[ObjectiveTaskView] = Field([], title="Tasks", validate_default=True)
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


class ScheduleList(BaseModel):
    """
    One page of schedules, newest first; pass `nextCursor` as `cursor` for the next page.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    next_cursor: str | None = Field(..., alias="nextCursor", title="Nextcursor")
    schedules: list[ScheduleView] = Field(..., title="Schedules")


class WebhookCreated(BaseModel):
    """
    The subscription and its signing secret (`whsec_…`, Standard Webhooks): shown this once.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    secret: str = Field(..., title="Secret")
    webhook: WebhookView


class WebhookDelivery(BaseModel):
    """
    One event owed to a subscription: `pending` (with its next try), `delivered`, `failed`.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    attempts: list[WebhookTry] | None = Field(None, title="Attempts")
    created_at: AwareDatetime = Field(..., alias="createdAt", title="Createdat")
    delivery_id: str = Field(..., alias="deliveryId", title="Deliveryid")
    event: str = Field(..., title="Event")
    event_key: str = Field(..., alias="eventKey", title="Eventkey")
    finished_at: AwareDatetime | None = Field(None, alias="finishedAt", title="Finishedat")
    last_error: str | None = Field(None, alias="lastError", title="Lasterror")
    last_status_code: int | None = Field(None, alias="lastStatusCode", title="Laststatuscode")
    next_try_at: AwareDatetime | None = Field(None, alias="nextTryAt", title="Nexttryat")
    status: Literal["pending", "delivered", "failed"] = Field(..., title="Status")
    subject: str = Field(..., title="Subject")
    tries: int = Field(..., title="Tries")


class WebhookDeliveryList(BaseModel):
    """
    One page of a subscription's deliveries, newest first; `nextCursor` continues.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    deliveries: list[WebhookDelivery] = Field(..., title="Deliveries")
    next_cursor: str | None = Field(..., alias="nextCursor", title="Nextcursor")


class WebhookList(BaseModel):
    """
    One page of subscriptions, newest first; pass `nextCursor` as `cursor` for the next.
    """

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
    )
    next_cursor: str | None = Field(..., alias="nextCursor", title="Nextcursor")
    webhooks: list[WebhookView] = Field(..., title="Webhooks")


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
