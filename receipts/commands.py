"""A job's commands with their payloads, read by reference.

The folded state keeps each `queue.command` as a reference (receipts/jobs.py `Command`: its seq
on the job's stream and small metadata), so a job with many large follow-ups stays a small
row. The handler that consumes commands, and the enqueue that compares a re-posted steer
with the one it absorbed, read the payloads from the receipts themselves, here. And a command
a job ends without reading is settled here (`with_unconsumed`, folded into the append that ends
the job).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from receipts.jobs import UNCONSUMED, Command, Job, apply, job_stream
from receipts.kinds import unconsumed_reason
from receipts.streams import Draft, Receipt


class Reads(Protocol):
    """What runs a named read: the store (a statement on its own) or an open transaction."""

    async def fetch(self, name: str, params: Mapping[str, Any]) -> Sequence[Sequence[Any]]: ...


@dataclass(frozen=True, slots=True)
class QueuedCommand:
    """A command with its payload: what a handler is handed."""

    ref: Command
    payload: Any

    @property
    def command_id(self) -> str:
        """The command's id (what `consume` takes)."""
        return self.ref.command_id

    @property
    def type(self) -> str:
        """`steer`, `follow_up` or `abort`."""
        return self.ref.type


def _params(job_id: str, refs: Sequence[Command]) -> dict[str, Any]:
    return {
        "stream": job_stream(job_id),
        "seqs": [c.seq for c in refs if c.seq is not None],
        "command_ids": [c.command_id for c in refs if c.seq is None],
    }


def _joined(refs: Sequence[Command], rows: Sequence[Sequence[Any]]) -> tuple[QueuedCommand, ...]:
    by_seq = {row[0]: row[2] for row in rows}
    by_id = {row[1]: row[2] for row in rows}
    return tuple(
        QueuedCommand(c, by_seq.get(c.seq) if c.seq is not None else by_id.get(c.command_id))
        for c in refs
    )


async def with_payloads(
    reads: Reads, job_id: str, refs: Sequence[Command]
) -> tuple[QueuedCommand, ...]:
    """The commands `refs` of job `job_id`, in their order, each with its payload read from its
    receipt (one round trip, on the store or in a caller's transaction; none when there is
    nothing to read)."""
    if not refs:
        return ()
    return _joined(refs, await reads.fetch("command_payloads", _params(job_id, refs)))


async def payload_bytes(reads: Reads, job_id: str, refs: Sequence[Command]) -> int:
    """The bytes of the payloads of the commands `refs` of job `job_id`, as their JSON text, summed
    where they are stored (one round trip; nothing read out, 0 when there is nothing to sum)."""
    if not refs:
        return 0
    rows = await reads.fetch("command_payload_bytes", _params(job_id, refs))
    return int(rows[0][0]) if rows else 0


def with_unconsumed(job: Job | None, drafts: Sequence[Draft]) -> list[Draft]:
    """`drafts` with a `queue.command.unconsumed` receipt for every steer or follow_up still
    pending when one of them ends the job, placed just before that one (the terminal receipt
    stays the job's last). Drafts that end nothing come back as they are."""
    if job is None or not job.pending_commands or job.terminal:
        return list(drafts)
    state: Job | None = job
    for index, draft in enumerate(drafts):
        receipt = Receipt(job_stream(job.job_id), 0, draft.type, draft.data, job.updated_at)
        after = apply(state, receipt)
        if after is not None and after.terminal:
            assert state is not None
            closing = [
                Draft(
                    UNCONSUMED,
                    {
                        "commandId": command.command_id,
                        "type": command.type,
                        "reason": unconsumed_reason(
                            state.agent_id, state.kind, state.payload, command.type
                        ),
                    },
                )
                for command in state.pending_commands
            ]
            return [*drafts[:index], *closing, *drafts[index:]]
        state = after
    return list(drafts)
