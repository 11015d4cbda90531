"""Shapes the API documents but reads by other means: the objective and cancel bodies (parsed by
`receipts.objectives.graph`, which names the field at fault in its own words) and the `end`
event of each live event stream. Each is a component of the published OpenAPI document, so a
generated client knows them; the routes validate what they receive themselves."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from receipts.agent_jobs.model import Status as AgentJobStatus
from receipts.jobs import Status
from receipts.kinds import OBJECTIVE_ID, AuthContext
from receipts.objectives.graph import (
    DEFAULT_TASK_AGENT,
    DEFAULT_TASK_ATTEMPTS,
    EXECUTION_PATHS,
    MAX_TASK_ATTEMPTS,
    MAX_TASKS,
    MAX_TEXT,
    TASK_ID,
)
from receipts.objectives.model import ObjectiveStatus


class _Body(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class CommandInput(_Body):
    """A task that runs a command: its argv, no shell unless the argv asks for one."""

    command: list[str] = Field(min_length=1)


class PromptInput(_Body):
    """A task that runs the coding agent (`RECEIPT_CODEX_COMMAND`) with this prompt on stdin."""

    prompt: str = Field(min_length=1, max_length=MAX_TEXT)


class TaskBody(_Body):
    """One task of an objective's graph, run after the tasks it depends on."""

    task_id: str = Field(pattern=TASK_ID.pattern)
    title: str | None = Field(default=None, max_length=MAX_TEXT)
    agent_id: Literal[DEFAULT_TASK_AGENT] = DEFAULT_TASK_AGENT  # type: ignore[valid-type]
    input: CommandInput | PromptInput
    depends_on: list[str] = Field(default_factory=list)
    execution_path: Literal[EXECUTION_PATHS] = "local"  # type: ignore[valid-type]
    timeout_ms: int | None = Field(default=None, gt=0)
    max_attempts: int = Field(default=DEFAULT_TASK_ATTEMPTS, ge=1, le=MAX_TASK_ATTEMPTS)


class StepBody(_Body):
    """The validate or publish step: one command run in the objective's workspace."""

    command: list[str] = Field(min_length=1)


class ObjectiveBody(_Body):
    """`POST /objectives`: a written goal and, unless the planner supplies them, its tasks.

    `authContext` may be left out by a token of an organization (the token's is used)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", regex_engine="python-re"
    )
    objective_id: str | None = Field(default=None, pattern=OBJECTIVE_ID.pattern)
    title: str = Field(min_length=1, max_length=MAX_TEXT)
    goal: str = Field(min_length=1, max_length=MAX_TEXT)
    tasks: list[TaskBody] | None = Field(default=None, min_length=1, max_length=MAX_TASKS)
    validate_: StepBody | None = Field(default=None, alias="validate")
    publish: StepBody | None = None
    auth_context: AuthContext | None = None


class ObjectiveCancelBody(_Body):
    """`POST /objectives/{objectiveId}/cancel` (the body may be left out)."""

    reason: str | None = None


class ScheduleBody(_Body):
    """`POST /schedules`: when it fires (a five-field `cron` in `timezone`, or an `interval` such
    as `15m`), the enqueue body each firing posts to `agentId` (its job id is
    `<scheduleId>:<fire time>`), and what a firing does while the previous job is still active."""

    schedule_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._@-]{1,120}$")
    cron: str | None = Field(
        default=None, max_length=200, examples=["*/15 * * * *", "0 9 * * mon-fri"]
    )
    interval: str | None = Field(
        default=None, max_length=200, pattern=r"^\d+[smhd]$", examples=["30s", "1h"]
    )
    timezone: str = Field(default="UTC", max_length=200, examples=["Europe/Paris"])
    agent_id: str = Field(min_length=1)
    job: dict[str, Any] = Field(description="The enqueue body (as POST /agents/{agentId}/jobs)")
    overlap: Literal["skip", "allow", "cancel_previous"] = "skip"
    paused: bool = False


class SchedulePatchBody(_Body):
    """`PATCH /schedules/{scheduleId}`: pause or resume it, or change when it fires or what;
    a field left out keeps its value (`cron` and `interval` replace each other)."""

    paused: bool | None = None
    note: str | None = Field(default=None, max_length=1000)
    cron: str | None = Field(default=None, max_length=200)
    interval: str | None = Field(default=None, max_length=200, pattern=r"^\d+[smhd]$")
    timezone: str | None = Field(default=None, max_length=200)
    agent_id: str | None = Field(default=None, min_length=1)
    job: dict[str, Any] | None = None
    overlap: Literal["skip", "allow", "cancel_previous"] | None = None


class JobStreamEnd(BaseModel):
    """The data of a job stream's `end` event: the job is terminal."""

    jobId: str
    status: Status


class ObjectiveStreamEnd(BaseModel):
    """The data of an objective stream's `end` event: it is settled and audited."""

    objectiveId: str
    status: ObjectiveStatus


class AgentJobStreamEnd(BaseModel):
    """The data of an agent job stream's `end` event: the job is finished."""

    agentJobId: str
    status: AgentJobStatus


DOCUMENTED: tuple[type[BaseModel], ...] = (
    ObjectiveBody,
    ObjectiveCancelBody,
    ScheduleBody,
    SchedulePatchBody,
    JobStreamEnd,
    ObjectiveStreamEnd,
    AgentJobStreamEnd,
)


def sse_documented(end: type[BaseModel] | None) -> dict[str, Any]:
    """The `text/event-stream` content of a stream's 200: its events and their data, as the
    `x-events` extension (OpenAPI 3.1 has no way to describe the events of a stream)."""
    events: dict[str, Any] = {
        "message": {
            "id": "the receipt's seq (send it back as Last-Event-ID to resume)",
            "data": {"$ref": "#/components/schemas/ReceiptView"},
        }
    }
    if end is not None:
        events["end"] = {"data": {"$ref": f"#/components/schemas/{end.__name__}"}}
    return {"schema": {"type": "string"}, "x-events": events}
