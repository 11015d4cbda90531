"""The objective model and its reducer: an objective's state is a pure fold over `objectives/<id>`.

Receipt types (all on the objective's stream):

- `objective.created` — the goal, the first phase's task graph, validate and publish;
- `objective.phase_added` — a new phase; pending tasks of earlier phases become `canceled`;
- `objective.task.dispatched` / `.started` / `.progress` / `.settled` — one try of a task, run
  as the job `objective:<id>:task:<taskId>:try:<n>`;
- `objective.step.dispatched` / `.started` / `.progress` / `.settled` — the validate and
  publish steps;
- `objective.control_requested` — the outbox: a control pass is owed; `objective.control_delivered`
  — the outbox handed it to a control job; `objective.reconciled` — a control pass covered every
  request up to `throughSeq`;
- `objective.cancel_requested`, `objective.settled`, `objective.audit_requested`,
  `objective.audited`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from receipts import streams
from receipts.errors import InvariantError
from receipts.streams import CamelModel, Receipt, StreamState
from receipts.tenancy import derived_id

STREAM_PREFIX = "objectives/"
STATUSES: tuple[str, ...] = ("active", "completed", "failed", "canceled")
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "canceled"})
TASK_ACTIVE: frozenset[str] = frozenset({"dispatched", "running"})
STEPS: tuple[str, ...] = ("validate", "publish")

ObjectiveStatus = Literal["active", "completed", "failed", "canceled"]
TaskStatus = Literal["pending", "dispatched", "running", "completed", "failed", "canceled"]


def objective_stream(objective_id: str) -> str:
    """`objectives/<objectiveId>`."""
    return STREAM_PREFIX + objective_id


def session_key(objective_id: str) -> str:
    """The session key every control job of an objective shares (singleton `steer`)."""
    return f"objective:{objective_id}"


# The jobs of an objective are named after it, `objective:<id>:…`; an objective id scoped by its
# organization (`<id>~<tag>`, receipts/tenancy.py) keeps its tag at the end of each, so a job is
# named by its organization as `objective:<id>:…` and retention finds an objective's jobs in the
# range `objective:<id>:` up to `objective:<id>;` (migrations/0012).


def task_job_id(objective_id: str, task_id: str, try_number: int) -> str:
    """The deterministic job id of one try of a task: a repeated dispatch creates nothing."""
    return derived_id(objective_id, "objective:", f":task:{task_id}:try:{try_number}")


def monitor_job_id(objective_id: str, task_id: str, try_number: int) -> str:
    """The job id of the monitor that mirrors one try of a task onto the objective stream."""
    return derived_id(objective_id, "objective:", f":task:{task_id}:try:{try_number}:monitor")


def _step_suffix(step: str, phase: int) -> str:
    # A step runs again after a phase is added (it must cover the new tasks): a job of its own.
    return f":{step}" if phase <= 1 else f":{step}:phase:{phase}"


def step_job_id(objective_id: str, step: str, phase: int = 1) -> str:
    """The job id of the validate or publish step run for `phase`."""
    return derived_id(objective_id, "objective:", _step_suffix(step, phase))


def step_monitor_job_id(objective_id: str, step: str, phase: int = 1) -> str:
    """The job id of the monitor that mirrors the validate or publish step onto the objective."""
    return derived_id(objective_id, "objective:", f"{_step_suffix(step, phase)}:monitor")


def control_job_id(objective_id: str, request_seq: int) -> str:
    """The control job delivering the request at `request_seq` (redelivery adds nothing)."""
    return derived_id(objective_id, "objective:", f":control:{request_seq}")


def audit_job_id(objective_id: str) -> str:
    """The objective's one audit job."""
    return derived_id(objective_id, "objective:", ":audit")


def run_job_id(objective_id: str) -> str:
    """The `factory.run` job POST /objectives enqueues (a re-post returns the same job)."""
    return derived_id(objective_id, "objective:", ":run")


class TaskTry(CamelModel):
    """One try of a task: its job and how it ended."""

    number: int
    job_id: str
    status: TaskStatus = "dispatched"
    dispatched_at: datetime
    started_at: datetime | None = None
    settled_at: datetime | None = None
    job_attempts: int | None = None
    error: str | None = None


class TaskState(CamelModel):
    """A task of the graph, its phase, status and tries."""

    task_id: str
    title: str
    agent_id: str
    input: dict[str, Any]
    depends_on: tuple[str, ...] = ()
    execution_path: str = "local"
    timeout_ms: int | None = None
    max_attempts: int = 1
    phase: int = 1
    status: TaskStatus = "pending"
    tries: tuple[TaskTry, ...] = ()
    last_output: str | None = None
    output_lines: int = 0
    error: str | None = None
    canceled_reason: str | None = None

    @property
    def current(self) -> TaskTry | None:
        """The latest try, if any."""
        return self.tries[-1] if self.tries else None

    @property
    def job_id(self) -> str | None:
        """The job of the latest try."""
        return self.tries[-1].job_id if self.tries else None


class StepState(CamelModel):
    """The validate or publish step."""

    name: str
    command: tuple[str, ...]
    status: TaskStatus = "pending"
    job_id: str | None = None
    dispatched_at: datetime | None = None
    started_at: datetime | None = None
    settled_at: datetime | None = None
    last_output: str | None = None
    output_lines: int = 0
    error: str | None = None
    phase: int | None = None  # the phase it was dispatched for (None: written before it was)

    def again(self) -> StepState:
        """The step to run again, for a phase added after it ran or was dispatched."""
        return StepState(name=self.name, command=self.command)


class ObjectiveState(StreamState):
    """The folded state of one objective (the `objectives` projection row stores exactly this)."""

    STREAM_PREFIX = STREAM_PREFIX
    ID_FIELD = "objective_id"
    TERMINAL = TERMINAL

    objective_id: str
    organization_id: str
    auth_context: dict[str, Any]
    title: str
    goal: str
    status: ObjectiveStatus = "active"
    phase: int = 1
    planned: bool = False
    run_job_id: str | None = None
    tasks: tuple[TaskState, ...] = ()
    validate_step: StepState | None = None
    publish_step: StepState | None = None
    control_requested_seq: int = 0
    control_delivered_seq: int = 0
    reconciled_seq: int = 0
    last_control_reason: str | None = None
    control_job_id: str | None = None
    cancel_requested: bool = False
    cancel_reason: str | None = None
    error: str | None = None
    failed_task: str | None = None
    failed_step: str | None = None
    audit_job_id: str | None = None
    audit: dict[str, Any] | None = None
    # The W3C trace context of its run job (the caller's trace): every job it enqueues joins it.
    traceparent: str | None = None

    @property
    def control_pending(self) -> bool:
        """A control request the outbox has not yet handed to a control job."""
        return self.control_requested_seq > self.control_delivered_seq

    @property
    def needs_reconcile(self) -> bool:
        """A control request no control pass has covered yet."""
        return self.control_requested_seq > self.reconciled_seq

    def task(self, task_id: str) -> TaskState | None:
        """The task with this id, or None."""
        return next((t for t in self.tasks if t.task_id == task_id), None)

    def step(self, name: str) -> StepState | None:
        """The validate or publish step, when configured."""
        return self.validate_step if name == "validate" else self.publish_step

    @property
    def phase_tasks(self) -> tuple[TaskState, ...]:
        """The tasks of the current phase."""
        return tuple(t for t in self.tasks if t.phase == self.phase)

    def active_job_ids(self) -> list[str]:
        """Jobs of task tries and steps that were dispatched and not yet recorded settled."""
        jobs = [t.job_id for t in self.tasks if t.status in TASK_ACTIVE and t.job_id]
        for name in STEPS:
            step = self.step(name)
            if step is not None and step.status in TASK_ACTIVE and step.job_id:
                jobs.append(step.job_id)
        return jobs


@dataclass(frozen=True, slots=True)
class ObjectiveSummary:
    """What a list shows of an objective (`api_list_objectives` counts its tasks)."""

    objective_id: str
    organization_id: str
    title: str
    status: str
    phase: int
    tasks: int
    completed_tasks: int
    error: str | None
    created_at: datetime
    updated_at: datetime


def _task_from(raw: Mapping[str, Any], phase: int) -> TaskState:
    return TaskState(
        task_id=raw["taskId"],
        title=raw.get("title") or raw["taskId"],
        agent_id=raw.get("agentId") or "codex",
        input=dict(raw["input"]),
        depends_on=tuple(raw.get("dependsOn") or ()),
        execution_path=raw.get("executionPath") or "local",
        timeout_ms=raw.get("timeoutMs"),
        max_attempts=int(raw.get("maxAttempts") or 1),
        phase=phase,
    )


def _step_from(name: str, raw: Any) -> StepState | None:
    if not raw:
        return None
    return StepState(name=name, command=tuple(raw["command"]))


def _replace_task(state: ObjectiveState, task: TaskState) -> tuple[TaskState, ...]:
    return tuple(task if t.task_id == task.task_id else t for t in state.tasks)


def _replace_try(task: TaskState, number: int, **changes: Any) -> tuple[TaskTry, ...]:
    return tuple(t.model_copy(update=changes) if t.number == number else t for t in task.tries)


def apply(state: ObjectiveState | None, receipt: Receipt) -> ObjectiveState:
    """Fold one receipt into the objective. Receipts the state does not admit (a settlement of
    a superseded try, a dispatch of a settled task) change nothing but `seq`."""
    data = receipt.data
    at = receipt.recorded_at
    if state is None:
        if receipt.type != "objective.created":
            raise InvariantError(f"Invariant: no objective for {receipt.stream}")
        return ObjectiveState(
            objective_id=data["objectiveId"],
            organization_id=data["organizationId"],
            auth_context=dict(data.get("authContext") or {}),
            title=data["title"],
            goal=data["goal"],
            planned=bool(data.get("planned", False)),
            run_job_id=data.get("runJobId"),
            traceparent=data.get("traceparent"),
            tasks=tuple(_task_from(t, 1) for t in data["tasks"]),
            validate_step=_step_from("validate", data.get("validate")),
            publish_step=_step_from("publish", data.get("publish")),
            created_at=at,
            updated_at=at,
            seq=receipt.seq,
        )
    changes = _changes(state, receipt.type, data, at, receipt.seq)
    update: dict[str, Any] = {"seq": receipt.seq}
    if changes:
        update["updated_at"] = at
        update.update(changes)
    return state.model_copy(update=update)


def _changes(
    state: ObjectiveState, kind: str, data: Mapping[str, Any], at: datetime, seq: int
) -> dict[str, Any]:
    if kind == "objective.control_requested":
        return {"control_requested_seq": seq, "last_control_reason": data.get("reason")}
    if kind == "objective.control_delivered":
        return {
            "control_delivered_seq": max(state.control_delivered_seq, int(data["throughSeq"])),
            "control_job_id": data.get("controlJobId"),
        }
    if kind == "objective.reconciled":
        return {"reconciled_seq": max(state.reconciled_seq, int(data["throughSeq"]))}
    # The audit is requested in the settling transaction, after `objective.settled`, and lands
    # after it: both apply to a settled objective.
    if kind == "objective.audit_requested":
        return {"audit_job_id": data.get("auditJobId")}
    if kind == "objective.audited":
        return {"audit": dict(data.get("summary") or {})}
    if kind == "objective.task.progress":
        task = state.task(str(data.get("taskId")))
        if task is None or task.current is None or task.current.number != data.get("try"):
            return {}
        task = task.model_copy(
            update={
                "last_output": data.get("lastLine"),
                "output_lines": int(data.get("lines") or task.output_lines),
            }
        )
        return {"tasks": _replace_task(state, task)}
    if kind == "objective.task.settled":
        return _task_settled(state, data, at)
    if kind == "objective.step.progress":
        # As a task's: also after the step settled (its monitor may mirror the last output after
        # control recorded the settlement, as a loaded worker's monitor did in a CI run).
        step = state.step(str(data.get("step")))
        if step is None or step.job_id != data.get("jobId"):
            return {}
        update = {
            "last_output": data.get("lastLine"),
            "output_lines": int(data.get("lines") or step.output_lines),
        }
        return {f"{step.name}_step": step.model_copy(update=update)}
    if kind == "objective.step.settled":
        step = state.step(str(data.get("step")))
        if step is None or step.status not in TASK_ACTIVE or step.job_id != data.get("jobId"):
            return {}
        step = step.model_copy(
            update={"status": data["status"], "settled_at": at, "error": data.get("error")}
        )
        earlier = step.phase is not None and step.phase < state.phase
        if earlier and (step.status == "completed" or data.get("again")):
            # It covered an earlier phase: it runs again after the new one. A failed or
            # canceled run says so (`again`, since 2026-12-06); older chains fold as they did.
            step = step.again()
        return {f"{step.name}_step": step}
    if state.terminal:
        return {}
    if kind == "objective.phase_added":
        phase = int(data["phase"])
        superseded = tuple(
            t.model_copy(
                update={"status": "canceled", "canceled_reason": f"superseded by phase {phase}"}
            )
            if t.status == "pending"
            else t
            for t in state.tasks
        )
        added = tuple(_task_from(t, phase) for t in data["tasks"])
        # Validate and publish come last: one that completed covered the earlier phases only,
        # so it runs again after the new one (one still running runs again once it ends). So
        # does one whose failure was recorded before the phase landed (`failedStepsAgain`,
        # since 2026-12-07), as one recorded after it does (`again` on its settlement): the
        # objective's outcome no longer hangs on which of the two writes committed first.
        # Older chains fold as they did.
        again = ("completed", "failed", "canceled") if data.get("failedStepsAgain") else ()
        steps = {
            f"{step.name}_step": step.again()
            for name in STEPS
            if (step := state.step(name)) is not None
            and (step.status == "completed" or step.status in again)
        }
        return {"phase": phase, "tasks": superseded + added, **steps}
    if kind == "objective.task.dispatched":
        task = state.task(str(data.get("taskId")))
        number = int(data["try"])
        if task is None or task.status != "pending" or number != len(task.tries) + 1:
            return {}
        attempt = TaskTry(number=number, job_id=str(data["jobId"]), dispatched_at=at)
        task = task.model_copy(update={"status": "dispatched", "tries": (*task.tries, attempt)})
        return {"tasks": _replace_task(state, task)}
    if kind == "objective.step.started":
        step = state.step(str(data.get("step")))
        if step is None or step.status not in TASK_ACTIVE or step.job_id != data.get("jobId"):
            return {}
        return {
            f"{step.name}_step": step.model_copy(update={"status": "running", "started_at": at})
        }
    if kind == "objective.task.started":
        task = state.task(str(data.get("taskId")))
        if task is None or task.status != "dispatched" or task.current is None:
            return {}
        if task.current.number != data.get("try"):
            return {}
        task = task.model_copy(
            update={
                "status": "running",
                "tries": _replace_try(task, task.current.number, status="running", started_at=at),
            }
        )
        return {"tasks": _replace_task(state, task)}
    if kind == "objective.step.dispatched":
        step = state.step(str(data.get("step")))
        if step is None or step.status != "pending":
            return {}
        update = {"status": "dispatched", "job_id": data["jobId"], "dispatched_at": at}
        step = step.model_copy(update={**update, "phase": data.get("phase")})
        return {f"{step.name}_step": step}
    if kind == "objective.cancel_requested":
        return {"cancel_requested": True, "cancel_reason": data.get("reason")}
    if kind == "objective.settled":
        return {
            "status": data["status"],
            "error": data.get("error"),
            "failed_task": data.get("failedTask"),
            "failed_step": data.get("failedStep"),
            "settled_at": at,
        }
    if kind == "objective.created":
        raise InvariantError("Invariant: objective created twice")
    raise InvariantError(f"Invariant: unknown objective receipt type {kind!r}")


def _task_settled(state: ObjectiveState, data: Mapping[str, Any], at: datetime) -> dict[str, Any]:
    task = state.task(str(data.get("taskId")))
    if task is None or task.status not in TASK_ACTIVE or task.current is None:
        return {}
    number = task.current.number
    if number != data.get("try") or task.current.job_id != data.get("jobId"):
        return {}
    outcome: TaskStatus = data["status"]
    tries = _replace_try(
        task,
        number,
        status=outcome,
        settled_at=at,
        error=data.get("error"),
        job_attempts=data.get("jobAttempts"),
        started_at=task.current.started_at or _dt(data.get("startedAt")),
    )
    status: TaskStatus = outcome
    if (
        outcome == "failed"
        and number < task.max_attempts
        and not state.terminal
        and task.phase == state.phase
    ):
        status = "pending"  # retried within the task's own budget (a superseded one is not)
    task = task.model_copy(update={"status": status, "tries": tries, "error": data.get("error")})
    return {"tasks": _replace_task(state, task)}


def _dt(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else None


def fold(receipts: Iterable[Receipt], state: ObjectiveState | None = None) -> ObjectiveState | None:
    """Fold receipts in order from `state` (None: the empty stream)."""
    return streams.fold(apply, receipts, state)
