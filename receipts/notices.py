"""Which NOTIFY channels an append is announced on: one per concern, so that a notice reaches only
the processes that act on it (a process LISTENs to the channels its subscribers name,
receipts/listen.py). Every append statement notifies the channels `channels(stream, types)`
gives, with the same payload (`{stream, seq, types}`, each type of the append named once).

The concerns, by stream prefix and receipt type (the layers above name their streams; this table
is the one place that routes them):

* `receipts_streams` — every append: the API's event streams, each following one stream (the
  API LISTENs only while a stream is open);
* `receipts_dispatch` — a job enqueued or settled (its slot free): the driver's dispatcher;
* `receipts_commands` — a command appended to a job, or its lease taken over by a later delivery
  (a start-fence heartbeat): the watcher of its running attempt, which stops its handler at the
  takeover instead of at its next heartbeat;
* `receipts_agent_jobs` — any agent-job append, and a job settled (a turn's queue job, or one
  that frees a slot an agent job waits for): the agent-job dispatcher;
* `receipts_objectives` — a control request on an objective: the control outbox.
"""

from __future__ import annotations

from collections.abc import Sequence

STREAMS = "receipts_streams"
DISPATCH = "receipts_dispatch"
COMMANDS = "receipts_commands"
AGENT_JOBS = "receipts_agent_jobs"
OBJECTIVES = "receipts_objectives"
ALL = (STREAMS, DISPATCH, COMMANDS, AGENT_JOBS, OBJECTIVES)

JOB_PREFIX = "jobs/"
AGENT_JOB_PREFIX = "agent-jobs/"
OBJECTIVE_PREFIX = "objectives/"
# A job leaves the running set (its dispatch slot, and an agent's slot, may be free).
SETTLED_TYPES = frozenset({"job.completed", "job.failed", "job.canceled", "job.lease_expired"})


def channels(stream: str, types: Sequence[str], *, takeover: bool = False) -> list[str]:
    """The channels an append of `types` to `stream` is announced on (`STREAMS` always);
    `takeover`: it takes a job's lease over from another delivery."""
    out = [STREAMS]
    if stream.startswith(JOB_PREFIX):
        settled = not SETTLED_TYPES.isdisjoint(types)
        if settled or "job.enqueued" in types:
            out.append(DISPATCH)
        if "queue.command" in types or takeover:
            out.append(COMMANDS)
        if settled:
            out.append(AGENT_JOBS)
    elif stream.startswith(AGENT_JOB_PREFIX):
        out.append(AGENT_JOBS)
    elif stream.startswith(OBJECTIVE_PREFIX) and "objective.control_requested" in types:
        out.append(OBJECTIVES)
    return out
