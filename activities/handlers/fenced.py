"""What a handler may do to the receipts: named operations, not the store.

Writes to the handler's own job (progress, consuming a command) go only through its attempt's
fence, so a delivery that lost its lease writes nothing there. Objective writes are decided
against the objective's current state under its stream lock (as every objective write is,
`receipts/objectives/store.py`), and in the same transaction the handler's job row is locked
and its fence checked: a delivery that lost its lease (a stalled worker woken after Temporal
redelivered its attempt) writes nothing to an objective either, and the fence cannot move
before the write commits. The row is locked in the order every objective transaction takes
(`receipts/objectives/store.py`): before the objective's stream, unless the job is one of the
objective's control jobs, whose rows are locked after it. Everything else is a read.

The objectives and jobs a handler reads and writes are those of its job's organization: another
organization's look exactly as if they did not exist, whatever id the payload names.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from activities.fence import AttemptFence
from receipts.agent_jobs import lifecycle
from receipts.agent_jobs.model import AgentJob
from receipts.commands import QueuedCommand, with_payloads
from receipts.enqueue import EnqueueRequest, OrgCaps, enqueue_in
from receipts.jobs import Command, Job, Receipt, fence_rejection, job_stream
from receipts.objectives import control
from receipts.objectives import metrics as factory_metrics
from receipts.objectives import store as objectives
from receipts.objectives.model import ObjectiveState, objective_stream, session_key
from receipts.store import Tx

log = logging.getLogger(__name__)


class FenceLost(Exception):
    """The handler's delivery no longer holds its attempt's fence: the objective write it asked
    for was refused and nothing of its transaction was written."""


class FencedReceipts:
    """The receipts one attempt's handler reads and writes, through its fence."""

    def __init__(
        self, fence: AttemptFence, session: str | None = None, organization_id: str | None = None
    ) -> None:
        self._fence = fence
        self._store = fence.store
        self._session = session  # the job's session key: which lock order its guard takes
        # The job's organization: the objectives and jobs it reads and writes are its own (None:
        # the runtime's own work, the watchdog's, which reads every organization's).
        self._organization = organization_id
        self._own_jobs: set[str] = set()

    # --- the handler's own job, under the attempt's fence ------------------------------------

    async def progress(self, data: Any) -> bool:
        """Append `job.progress`; False once the fence refuses (the lease is lost)."""
        return await self._fence.progress(data)

    async def consume(self, command_id: str) -> bool:
        """Append `queue.command.consumed`; False when refused or no longer pending."""
        return await self._fence.consume(command_id)

    async def own_job(self) -> Job | None:
        """The handler's job as it is now (its pending commands, an abort)."""
        return await self._store.get_job(self._fence.job_id)

    async def own_commands(self, refs: Sequence[Command]) -> tuple[QueuedCommand, ...]:
        """The handler's job's commands `refs`, in order, each with its payload (the job's
        state keeps references; the payloads are read from the commands' receipts)."""
        return await with_payloads(self._store, self._fence.job_id, refs)

    # --- other jobs (reads) -------------------------------------------------------------------

    def _sees(self, organization_id: str | None) -> bool:
        return self._organization is None or organization_id == self._organization

    async def job(self, job_id: str) -> Job | None:
        """Another job of the handler's organization, or None (another organization's job is
        treated as one that does not exist)."""
        job = await self._store.get_job(job_id)
        if job is None or not self._sees(job.organization_id):
            return None
        self._own_jobs.add(job_id)
        return job

    async def jobs(self, job_ids: Sequence[str]) -> dict[str, Job]:
        """The jobs of the handler's organization with these ids (others are left out)."""
        found = await objectives.jobs_by_ids(self._store, job_ids)
        return {i: j for i, j in found.items() if self._sees(j.organization_id)}

    async def job_receipts(self, job_id: str, after_seq: int) -> list[Receipt]:
        """A job's receipts after `after_seq`, in order (none for another organization's)."""
        if job_id not in self._own_jobs and await self.job(job_id) is None:
            return []
        return await self._store.read_stream(job_stream(job_id), after_seq)

    # --- objectives ---------------------------------------------------------------------------

    async def objective(self, objective_id: str) -> ObjectiveState | None:
        """The objective's folded state, or None (another organization's is treated as absent)."""
        return objectives.of_organization(
            await objectives.get(self._store, objective_id), self._organization
        )

    async def active_objectives(
        self, limit: int, tick: int = 0
    ) -> tuple[list[ObjectiveState], datetime | None]:
        """Up to `limit` active objectives, tick `tick`'s window of them (`objectives.active`;
        the handler's organization's only, when it has one) and the database clock (None when
        there are none)."""
        states, now = await objectives.active(self._store, limit, tick)
        return [s for s in states if self._sees(s.organization_id)], now

    async def objectives_under_control(self, states: Sequence[ObjectiveState]) -> set[str]:
        """The ids of those objectives that have an active control job."""
        return await objectives.under_control(
            self._store, [s for s in states if self._sees(s.organization_id)]
        )

    async def phase_added_by(self, objective_id: str, job_id: str) -> int | None:
        """The phase the job `job_id` added to the objective (of the handler's organization),
        or None."""
        if await self.objective(objective_id) is None:
            return None
        return await objectives.phase_added_by(self._store, objective_id, job_id)

    async def update_objective(
        self, objective_id: str, decide: objectives.Decide, *, deliver_control: bool = False
    ) -> bool:
        """Append what `decide` chooses from the objective's current state, in one transaction;
        with `deliver_control`, hand a control request it recorded to a control job in the same
        transaction (`decide` chose nothing: nothing is delivered). Returns whether anything
        was written: nothing is, and `decide` is not asked, for an objective of another
        organization. Raises FenceLost, writing nothing, once the attempt's fence is lost."""
        async with self._store.transaction() as tx:
            _, written = await objectives.update(
                tx, objective_id, decide, self._holds_fence, organization_id=self._organization
            )
            if written and deliver_control:
                await objectives.deliver(tx, objective_id)
        return bool(written)

    async def request_control(self, objective_id: str, reason: str, **detail: Any) -> bool:
        """Record a control request for the objective and deliver it; False, writing nothing,
        when there is no such objective (of the handler's organization). Raises FenceLost,
        writing nothing, once the attempt's fence is lost."""
        async with self._store.transaction() as tx:
            state = await objectives.request_control(
                tx,
                objective_id,
                reason,
                guard=self._holds_fence,
                organization_id=self._organization,
                **detail,
            )
        return state is not None

    async def reconcile(
        self, objective_id: str, kind: str, caps: OrgCaps | None = None
    ) -> control.ReconcileResult:
        """Run control passes over the objective until one finds nothing to do, its task
        dispatch held to the organization's `caps` of open jobs. Every transaction of a pass
        that writes the objective holds the attempt's fence; the first refused raises FenceLost
        and stops the passes. Another organization's objective is treated as absent: no pass
        runs."""
        if await self.objective(objective_id) is None:
            return control.ReconcileResult()
        return await control.reconcile(self._store, objective_id, kind, self._holds_fence, caps)

    async def _holds_fence(self, tx: Tx, objective_id: str) -> None:
        """Lock the handler's job row for the rest of `tx` and raise FenceLost unless this
        delivery still holds its attempt's fence. Runs before `objectives.update` locks the
        objective's stream, so the row comes first, as when the job's own settle or lease
        expiry asks for control on the objective; a control job of this objective (its session
        key) takes the stream first, as `deliver` does before it locks control job rows."""
        if self._session == session_key(objective_id):
            await tx.lock_streams([objective_stream(objective_id)])
        await self._check_fence(tx)

    # --- handing the work on --------------------------------------------------------------

    async def hand_off(self, job_id: str, payload: dict[str, Any]) -> Job:
        """Enqueue the job that carries this one's work on (`job_id`, the same agent, kind,
        organization and attempt budget, `payload`), in one transaction under the attempt's
        fence: a delivery that lost its lease hands nothing on. An existing job of that id is
        returned unchanged. Raises FenceLost when refused."""
        own = self._fence
        async with self._store.transaction() as tx:
            job = await self._check_fence(tx)
            result = await enqueue_in(
                tx,
                EnqueueRequest(
                    agent_id=job.agent_id,
                    payload=payload,
                    kind=job.kind,
                    organization_id=job.organization_id,
                    job_id=job_id,
                    max_attempts=job.max_attempts,
                    traceparent=job.traceparent,  # the work goes on in its trace
                ),
            )
        log.info(
            "work handed on to a new job",
            extra={"event": "handler.handed_off", "jobId": own.job_id, "successor": job_id},
        )
        return result.job

    async def _check_fence(self, tx: Tx) -> Job:
        """Lock the handler's job row for the rest of `tx`; return it, or raise FenceLost (and
        log and count the refusal) unless this delivery still holds its attempt's fence."""
        fence = self._fence
        job = await tx.job_for_update(fence.job_id)
        rejection = fence_rejection(job, fence.worker_id, fence.attempt, await tx.now())
        if rejection is None:
            assert job is not None
            return job
        log.warning(
            "handler write refused: the delivery no longer holds its attempt's fence",
            extra={
                "event": "attempt.objective_write_refused",
                "jobId": fence.job_id,
                "attempt": fence.attempt,
                "workerId": fence.worker_id,
                "status": rejection,
            },
        )
        factory_metrics.OBJECTIVE_WRITES_REFUSED.labels(rejection).inc()
        raise FenceLost(f"handler write refused: {rejection}")

    # --- agent jobs ---------------------------------------------------------------------------

    async def agent_job(self, agent_job_id: str) -> AgentJob | None:
        """The agent job's folded state, or None."""
        return await lifecycle.get(self._store, agent_job_id)
