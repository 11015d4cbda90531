"""The agent job: statuses, the one transition table, its stream and ids, the fold of
`agent-jobs/<id>` and the wakeup it sends its owner. No I/O here; the decisions of its lifecycle
(claims, turn settlement, budgets) are in `decisions.py`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Literal

from receipts import streams
from receipts.errors import InvariantError
from receipts.streams import CamelModel, Receipt, StreamState, time_of

STATUSES: tuple[str, ...] = (
    "queued",
    "running",
    "waiting_on_user",
    "succeeded",
    "failed",
    "stopped",
)
TERMINAL_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "stopped"})
WAKEUP_STATUSES: frozenset[str] = frozenset({"waiting_on_user", "succeeded", "failed"})
Status = Literal["queued", "running", "waiting_on_user", "succeeded", "failed", "stopped"]

# The one table. Every status change of an agent job goes through `transition_allowed`.
TRANSITIONS: Mapping[str, frozenset[str]] = {
    "queued": frozenset({"running", "stopped"}),
    "running": frozenset({"waiting_on_user", "succeeded", "failed", "stopped", "queued"}),
    "waiting_on_user": frozenset({"running", "stopped", "failed"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "stopped": frozenset(),
}

SLOTS_PER_AGENT = 3

STREAM_PREFIX = "agent-jobs/"
SESSION_STREAM_PREFIX = "sessions/"
TURN_AGENT_ID = "codex"

CREATED = "agent_job.created"
TRANSITIONED = "agent_job.transitioned"
TURN_STARTED = "agent_job.turn_started"
ANSWERED = "agent_job.answered"
CANCEL_REQUESTED = "agent_job.cancel_requested"
# A turn's model calls through the AI gateway: one summary per turn that made any.
USAGE = "agent_job.usage"
RECEIPT_TYPES: tuple[str, ...] = (
    CREATED,
    TRANSITIONED,
    TURN_STARTED,
    ANSWERED,
    CANCEL_REQUESTED,
    USAGE,
)
USAGE_TOTALS: tuple[str, ...] = ("calls", "inputTokens", "outputTokens")
WAKEUP = "session.wakeup"


def transition_allowed(from_status: str, to_status: str) -> bool:
    """True when the table lets an agent job move from `from_status` to `to_status`."""
    return to_status in TRANSITIONS.get(from_status, frozenset())


def refused_message(agent_job_id: str, from_status: str, to_status: str) -> str:
    """The error of a refused transition; it names both ends."""
    return f"agent job {agent_job_id}: transition {from_status} -> {to_status} is not allowed"


def stream_of(agent_job_id: str) -> str:
    """`agent-jobs/<agentJobId>`."""
    return STREAM_PREFIX + agent_job_id


def session_stream(session_id: str) -> str:
    """`sessions/<sessionId>`: the owner session's stream, where wakeups land."""
    return SESSION_STREAM_PREFIX + session_id


def wakeup_source_id(agent_job_id: str, status: str, attempt: int, turn: int) -> str:
    """`<agentJobId>:<status>:<attempt>:<turn>`: unique per wakeup, so a replay writes nothing."""
    return f"{agent_job_id}:{status}:{attempt}:{turn}"


def queue_job_id(agent_job_id: str, attempt: int, turn: int | None = None) -> str:
    """`<agentJobId>:attempt:<n>`, or `<agentJobId>:attempt:<n>:turn:<t>` for a later turn."""
    base = f"{agent_job_id}:attempt:{attempt}"
    return base if turn is None else f"{base}:turn:{turn}"


def agent_job_id_of_queue_job(job_id: str) -> str | None:
    """The agent job a turn's queue job belongs to (None for any other job id)."""
    head, sep, _ = job_id.partition(":attempt:")
    return head if sep else None


class ReplyRoute(CamelModel):
    """Where the owner hears back: binding, channel, thread."""

    binding: str
    channel: str
    thread: str | None = None


class PendingToolCall(CamelModel):
    """The question a waiting job asked, under the tool call id the answer must name."""

    tool_call_id: str
    question: str


class AgentJob(StreamState):
    """The folded state of one agent job (the `agent_jobs` projection stores exactly this)."""

    STREAM_PREFIX = STREAM_PREFIX
    ID_FIELD = "agent_job_id"
    TERMINAL = TERMINAL_STATUSES

    agent_job_id: str
    agent_id: str
    organization_id: str
    user_id: str | None = None
    owner_session_id: str
    source_actor_event_id: str
    source_tool_call_id: str
    reply_route: ReplyRoute
    input: dict[str, Any]
    workspace_template: str | None = None
    continued_from_job_id: str | None = None
    workspace_owner_job_id: str
    provider_binding: str | None = None
    status: Status = "queued"
    attempt: int = 0
    turn: int = 0
    consecutive_failures: int = 0
    available_at: datetime | None = None
    started_at: datetime | None = None
    queue_job_id: str | None = None
    queue_job_ids: tuple[str, ...] = ()
    pending_tool_call: PendingToolCall | None = None
    answer: dict[str, Any] | None = None
    follow_up: Any = None
    cancel_requested: bool = False
    cancel_reason: str | None = None
    live_turn_job_id: str | None = None  # a stopped job's turn left to end on its own
    result: Any = None
    error: str | None = None
    # Its turns' model calls through the AI gateway, summed: calls, inputTokens, outputTokens.
    usage: dict[str, int] = {}
    # The W3C trace context of its create: its turns' queue jobs join that trace.
    traceparent: str | None = None

    @property
    def answer_pending(self) -> bool:
        """A waiting job that has its answer and only waits for a slot."""
        return self.status == "waiting_on_user" and self.answer is not None

    def latest_status(self) -> dict[str, Any]:
        """The latest-status projection: `interrupted` / `request_user_input` while waiting."""
        if self.status == "waiting_on_user" and self.pending_tool_call is not None:
            return {
                "state": "interrupted",
                "errorCode": "request_user_input",
                "pendingToolCall": self.pending_tool_call.model_dump(mode="json", by_alias=True),
                "answered": self.answer is not None,
            }
        return {"state": self.status, "errorCode": None, "pendingToolCall": None}


def _create(receipt: Receipt) -> AgentJob:
    d = receipt.data
    agent_job_id = str(d["agentJobId"])
    return AgentJob(
        agent_job_id=agent_job_id,
        agent_id=str(d["agentId"]),
        organization_id=str(d["organizationId"]),
        user_id=d.get("userId"),
        owner_session_id=str(d["ownerSessionId"]),
        source_actor_event_id=str(d["sourceActorEventId"]),
        source_tool_call_id=str(d["sourceToolCallId"]),
        reply_route=ReplyRoute.model_validate(d["replyRoute"]),
        input=dict(d["input"]),
        workspace_template=d.get("workspaceTemplate"),
        continued_from_job_id=d.get("continuedFromJobId"),
        workspace_owner_job_id=str(d.get("workspaceOwnerJobId") or agent_job_id),
        provider_binding=d.get("providerBinding"),
        traceparent=d.get("traceparent"),
        created_at=receipt.recorded_at,
        updated_at=receipt.recorded_at,
        seq=receipt.seq,
    )


def apply(job: AgentJob | None, receipt: Receipt) -> AgentJob:
    """Fold one receipt of `agent-jobs/<id>`; raise `InvariantError` for one that cannot apply."""
    kind, data, at = receipt.type, receipt.data, receipt.recorded_at
    if job is None:
        if kind != CREATED:
            raise InvariantError(f"Invariant: no agent job for {receipt.stream}")
        return _create(receipt)
    changes: dict[str, Any]
    if kind == TRANSITIONED:
        changes = _transitioned(job, data, at)
    elif kind == TURN_STARTED:
        if job.status != "running":
            raise InvariantError(f"agent job {job.agent_job_id}: a turn starts only while running")
        queue_id = str(data["queueJobId"])
        changes = {
            "turn": int(data["turn"]),
            "queue_job_id": queue_id,
            "queue_job_ids": (*job.queue_job_ids, queue_id),
            "follow_up": data.get("followUps") or None,
        }
    elif kind == ANSWERED:
        if job.status != "waiting_on_user" or job.answer is not None:
            raise InvariantError(f"agent job {job.agent_job_id} is not waiting for an answer")
        changes = {"answer": {"toolCallId": data.get("toolCallId"), "answer": data.get("answer")}}
    elif kind == CANCEL_REQUESTED:
        if job.terminal:
            raise InvariantError(f"agent job {job.agent_job_id} is {job.status}")
        changes = {"cancel_requested": True, "cancel_reason": data.get("reason")}
    elif kind == USAGE:
        changes = {
            "usage": {
                name: job.usage.get(name, 0) + int(data.get(name) or 0) for name in USAGE_TOTALS
            }
        }
    elif kind == CREATED:
        raise InvariantError(f"agent job {job.agent_job_id} exists already")
    else:
        raise InvariantError(f"Invariant: unknown receipt type {kind!r} on {receipt.stream}")
    return job.model_copy(update={**changes, "seq": receipt.seq, "updated_at": at})


def _transitioned(job: AgentJob, data: Mapping[str, Any], at: datetime) -> dict[str, Any]:
    from_status, to_status = str(data["from"]), str(data["to"])
    if from_status != job.status or not transition_allowed(from_status, to_status):
        raise InvariantError(refused_message(job.agent_job_id, from_status, to_status))
    changes: dict[str, Any] = {
        "status": to_status,
        "attempt": int(data.get("attempt", job.attempt)),
        "turn": int(data.get("turn", job.turn)),
        "consecutive_failures": int(data.get("consecutiveFailures", job.consecutive_failures)),
        "available_at": time_of(data, "availableAt"),
    }
    if to_status == "running":
        queue_id = str(data["queueJobId"])
        changes.update(
            queue_job_id=queue_id,
            queue_job_ids=(*job.queue_job_ids, queue_id),
            started_at=job.started_at or at,
            pending_tool_call=None,
        )
    else:
        changes["queue_job_id"] = None
    if data.get("clearStartedAt"):
        changes["started_at"] = None
    if to_status == "waiting_on_user":
        changes["pending_tool_call"] = PendingToolCall.model_validate(data["pendingToolCall"])
        changes["answer"] = None
    if "error" in data:
        changes["error"] = data.get("error")
    if "followUps" in data:
        changes["follow_up"] = data.get("followUps") or None
    if data.get("liveTurnJobId"):
        changes["live_turn_job_id"] = str(data["liveTurnJobId"])
    if to_status in TERMINAL_STATUSES:
        changes.update(settled_at=at, result=data.get("result"), pending_tool_call=None)
    return changes


def fold(receipts: Iterable[Receipt], job: AgentJob | None = None) -> AgentJob | None:
    """Fold receipts in order, starting from `job` (None: the empty stream)."""
    return streams.fold(apply, receipts, job)


def wakeup_data(job: AgentJob) -> dict[str, Any]:
    """The `session.wakeup` a job in a wakeup status appends to its owner session."""
    data: dict[str, Any] = {
        "sourceId": wakeup_source_id(job.agent_job_id, job.status, job.attempt, job.turn),
        "agentJobId": job.agent_job_id,
        "agentId": job.agent_id,
        "status": job.status,
        "attempt": job.attempt,
        "turn": job.turn,
        "replyRoute": job.reply_route.model_dump(mode="json", by_alias=True),
        "sourceActorEventId": job.source_actor_event_id,
        "sourceToolCallId": job.source_tool_call_id,
        "latestStatus": job.latest_status(),
    }
    if job.status == "succeeded":
        data["result"] = job.result
    elif job.status == "failed":
        data["error"] = job.error
    return data
