"""Retention: terminal jobs settled before a cutoff are deleted with every row that belongs to them.

One batch is one transaction: lock up to `batch` terminal jobs older than the cutoff (`SKIP
LOCKED`, so a prune never waits on or holds a live job's lock — live jobs are never selected at
all), then delete, for those ids, each dependent table's rows (`PRUNE_STEPS`, receipts first)
and finally the jobs rows. A job is pruned whole or not at all. The cutoff is read once from the
database clock, so a prune ends even while jobs keep settling.

Later layers hook in by adding a `PruneStep` (their rows keyed by the pruned job ids, deleted
in the same transaction). An agent job is pruned with its turns and an objective with its
jobs, never half: an objective's jobs are kept while it is there, and it while any job of it
is live (docs/history.md). A schedule's stream loses its old firing receipts, never its
definitions (`receipts/schedules/compaction.py`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from receipts.errors import InvalidInput
from receipts.jobs import ACTIVE_STATUSES
from receipts.schedules import compaction
from receipts.store import Store, Tx, translate_errors

DEFAULT_BATCH = 1_000
JOBS_PER_OWNER = 100
"""An agent job or an objective goes whole, with all its jobs and its chain (an objective's
progress mirror writes up to a receipt a second while a task runs): a batch takes one of them
for each JOBS_PER_OWNER jobs it may take (at least one), not `batch` of them, so one batch's
transaction stays near the size `--batch` names."""
CHAIN_RECEIPTS_PER_JOB = 10
"""A batch of `batch` jobs takes settled objectives while their chains (`objectives.seq`: an
objective's progress mirror writes up to a receipt a second per running task) hold at most
`batch * CHAIN_RECEIPTS_PER_JOB` receipts together, and always the first: an objective goes
whole, but one long chain is not deleted beside nine others in one transaction."""
SCHEDULE_RECEIPTS = "schedule_receipts"  # old firings compacted (receipts/schedules/compaction.py)
MAX_BATCH = 50_000


@dataclass(frozen=True, slots=True)
class PruneStep:
    """One table's rows of the pruned jobs: `prune_<name>` deletes them, `count_<name>` counts
    them (dry run); both take `%(job_ids)s`."""

    name: str

    @property
    def delete(self) -> str:
        return f"prune_{self.name}"

    @property
    def count(self) -> str:
        return f"count_{self.name}"


# In order; `jobs` is last (its rows are the ones locked for the batch).
PRUNE_STEPS: list[PruneStep] = [
    PruneStep("receipts"),
    PruneStep("deliveries"),
    PruneStep("delivery_redrives"),
    PruneStep("callback_posts"),
    PruneStep("callback_outbox"),
    PruneStep("webhook_deliveries"),
    PruneStep("workflow_runs"),
    PruneStep("activity_runs"),
    PruneStep("job_leases"),
]
JOBS_STEP = PruneStep("jobs")
# A settled agent job's own rows (by `%(agent_job_ids)s`), deleted in the batch that deletes its
# turns' queue jobs; its owner session's stream stays (it belongs to the session) but for the
# wakeups it wrote there, the stream's head kept.
AGENT_STEPS: list[PruneStep] = [
    PruneStep("agent_job_receipts"),
    PruneStep("agent_wakeup_callbacks"),
    PruneStep("agent_webhook_deliveries"),
    PruneStep("agent_session_receipts"),  # before the wakeup rows that name them
    PruneStep("agent_job_wakeups"),
    PruneStep("agent_jobs"),
]
# A settled objective's own rows (by `%(objective_ids)s`), deleted in the batch that deletes
# its jobs (`objective:<id>:…`), once none of them is live.
OBJECTIVE_STEPS: list[PruneStep] = [
    PruneStep("objective_receipts"),
    PruneStep("objective_webhook_deliveries"),
    PruneStep("objectives"),
]


@dataclass
class PruneResult:
    """What a prune removed (or, in a dry run, would remove): rows per table, batches run."""

    cutoff: datetime | None = None
    now: datetime | None = None  # the database clock when it started
    batches: int = 0
    removed: dict[str, int] = field(default_factory=dict)
    dry_run: bool = False
    # The last schedule compacted (the next pass starts after it; "" once every one was
    # looked at): passes bounded by `max_batches` take turns through the schedules.
    schedules_after: str = ""

    @property
    def jobs(self) -> int:
        return self.removed.get("jobs", 0)

    def add(self, name: str, count: int) -> None:
        self.removed[name] = self.removed.get(name, 0) + count

    def summary(self) -> str:
        """One line: `jobs=3 receipts=18 ...` in step order."""
        names = [JOBS_STEP.name, *(s.name for s in PRUNE_STEPS)]
        names += [s.name for s in (*AGENT_STEPS, *OBJECTIVE_STEPS) if s.name in self.removed]
        names += [SCHEDULE_RECEIPTS] if SCHEDULE_RECEIPTS in self.removed else []
        return " ".join(f"{n}={self.removed.get(n, 0)}" for n in names)


def _check_batch(batch: int) -> int:
    if not 1 <= batch <= MAX_BATCH:
        raise InvalidInput("batch", f"batch must be between 1 and {MAX_BATCH}; got {batch}")
    return batch


PASS_LOCK_KEY = "receipt:retention"


async def take_pass_lock(tx: Tx) -> bool:
    """Take the prune's single-flight lock for the life of `tx`; False when another process's
    pass holds it (nothing is waited for)."""
    return await tx.try_lock_key(PASS_LOCK_KEY)


Age = timedelta | datetime
"""What a prune or an export takes: an age (settled before the database clock minus it) or the
cutoff itself — an export's, so that the prune after it removes exactly what it archived."""


async def cutoff_for(store: Store, older_than: Age) -> tuple[datetime, datetime]:
    """`(cutoff, now)` by the database clock: now minus an age, or the time given."""
    now = await store.now()
    return (older_than if isinstance(older_than, datetime) else now - older_than), now


Key = tuple[datetime, str]
"""A place in a prune's order: (updated_at, id)."""
START: Key = (datetime.min.replace(tzinfo=UTC), "")


@dataclass
class Resume:
    """Where a pass's next batch starts, for each kind of victim: after the last one the last
    batch took. What a batch passes over (an objective a job of which owes a delivery, one
    whose stream a writer holds) is looked at again by the next pass, not by every batch after
    it: a batch's work is its own victims, and what is kept back cannot take a whole batch's
    place and end the pass before the victims after it."""

    jobs: Key = START
    agent_jobs: Key = START
    objectives: Key = START
    looked_at: int = 0
    """Victims read so far, of every kind."""

    async def victims(
        self, tx: Tx, kind: str, params: dict[str, Any], chain_budget: int | None = None
    ) -> list[str]:
        """The next batch of `kind` (`jobs`, `agent_jobs`, `objectives`), locked; the place
        moves past them. With `chain_budget`, the rows' third column (a chain's length) is
        summed and the batch ends before the row that would pass it (the first is always
        taken); the rows after it are looked at by the next batch."""
        after = getattr(self, kind)
        rows = await tx.fetch(
            VICTIMS[kind], {**params, "after_updated_at": after[0], "after_job_id": after[1]}
        )
        if rows and chain_budget is not None:
            taken, total = 0, 0
            for row in rows:
                total += int(row[2])
                if taken and total > chain_budget:
                    break
                taken += 1
            rows = rows[:taken]
        if rows:
            setattr(self, kind, (rows[-1][1], rows[-1][0]))
            self.looked_at += len(rows)
        return [row[0] for row in rows]


VICTIMS = {
    "jobs": "prune_victims",
    "agent_jobs": "prune_agent_victims",
    "objectives": "prune_objective_victims",
}


async def prune_batch(
    store: Store,
    cutoff: datetime,
    batch: int,
    steps: Sequence[PruneStep] | None = None,
    resume: Resume | None = None,
    callback_urls: Sequence[str] = (),
) -> dict[str, int]:
    """Delete one batch of terminal jobs settled before `cutoff`, of settled agent jobs with
    their turns' queue jobs, and of settled objectives with their jobs, each whole, from where
    `resume` says (the start without one) and moving it on; return rows per table (empty when
    nothing was left)."""
    removed: dict[str, int] = {}
    resume = resume or Resume()
    async with store.transaction() as tx:
        params = {"cutoff": cutoff, "batch": batch, "callback_urls": list(callback_urls)}
        owners = {**params, "batch": owners_per_batch(batch), "jobs_batch": batch}
        job_ids = await resume.victims(tx, "jobs", params)
        agent_job_ids = await resume.victims(tx, "agent_jobs", owners)
        if agent_job_ids:
            turns = await tx.fetch("agent_turn_jobs", {"agent_job_ids": agent_job_ids})
            job_ids += [row[0] for row in turns]
        objective_ids, objective_job_ids = await _objectives_to_prune(tx, owners, resume)
        job_ids = sorted({*job_ids, *objective_job_ids})
        if job_ids:
            for step in [*(PRUNE_STEPS if steps is None else steps), JOBS_STEP]:
                removed[step.name] = await tx.execute(step.delete, {"job_ids": job_ids})
        for step in AGENT_STEPS if agent_job_ids else []:
            removed[step.name] = await tx.execute(step.delete, {"agent_job_ids": agent_job_ids})
        for step in OBJECTIVE_STEPS if objective_ids else []:
            removed[step.name] = await tx.execute(step.delete, {"objective_ids": objective_ids})
    return removed


def owners_per_batch(batch: int) -> int:
    """The agent jobs, or the objectives, a batch of `batch` jobs takes (JOBS_PER_OWNER)."""
    return max(1, batch // JOBS_PER_OWNER)


async def _objectives_to_prune(
    tx: Tx, params: dict[str, Any], resume: Resume
) -> tuple[list[str], list[str]]:
    """The settled objectives this batch prunes, and all their jobs, locked.

    Nothing is waited for: an objective whose stream a writer holds (a late control request),
    one of whose job rows another transaction holds, or one a job of which turned live since
    the victims were read is left for the next pass, as is one a job of which still owes a
    callback or a webhook delivery. Holding each stream's lock, the prune
    cannot delete a chain under a writer's append, and no writer appends until it commits."""
    victims = await resume.victims(
        tx, "objectives", params, chain_budget=params["jobs_batch"] * CHAIN_RECEIPTS_PER_JOB
    )
    if not victims:
        return [], []
    rows = await tx.fetch("objective_streams_try_lock", {"objective_ids": victims})
    locked = {row[0] for row in rows}
    jobs_of = await _objective_jobs(tx, [o for o in victims if o in locked])
    quiet = [
        o
        for o in victims
        if o in locked and all(j.status not in ACTIVE_STATUSES for j in jobs_of[o])
    ]
    wanted = [j.job_id for o in quiet for j in jobs_of[o]]
    owing = {row[0] for row in await tx.fetch("jobs_owing_deliveries", {"job_ids": wanted})}
    held = {row[0] for row in await tx.fetch("jobs_try_lock", {"job_ids": wanted})}
    kept = [o for o in quiet if all(j.job_id in held and j.job_id not in owing for j in jobs_of[o])]
    return kept, [j.job_id for o in kept for j in jobs_of[o]]


class _ObjectiveJob(NamedTuple):
    job_id: str
    status: str
    updated_at: datetime


async def _objective_jobs(
    reads: Store | Tx, objective_ids: Sequence[str]
) -> dict[str, list[_ObjectiveJob]]:
    """Each objective's jobs, in job id order."""
    jobs_of: dict[str, list[_ObjectiveJob]] = {o: [] for o in objective_ids}
    if objective_ids:
        rows = await reads.fetch("objective_jobs", {"objective_ids": list(objective_ids)})
        for objective_id, *job in rows:
            jobs_of[objective_id].append(_ObjectiveJob(*job))
    return jobs_of


async def candidates(
    store: Store,
    cutoff: datetime,
    batch: int,
    *,
    which: str = "prune_candidates",
    callback_urls: Sequence[str] = (),
) -> AsyncIterator[list[str]]:
    """Yield the ids of the jobs (or with `which="prune_agent_candidates"`, the agent jobs) a
    prune at `cutoff` would remove, `batch` at a time, unlocked."""
    after: Key = START
    while True:
        rows = await store.fetch(
            which,
            {
                "cutoff": cutoff,
                "batch": batch,
                "callback_urls": list(callback_urls),
                "after_updated_at": after[0],
                "after_job_id": after[1],
            },
        )
        if not rows:
            return
        yield [row[0] for row in rows]
        after = (rows[-1][1], rows[-1][0])


async def prune(
    store: Store,
    older_than: Age,
    *,
    batch: int = DEFAULT_BATCH,
    dry_run: bool = False,
    max_batches: int | None = None,
    schedules_after: str = "",
    callback_urls: Sequence[str] = (),
    into: PruneResult | None = None,
) -> PruneResult:
    """Prune terminal jobs settled more than `older_than` ago (database clock; or before it, a
    time), batch by batch, until none is left (or `max_batches` ran). A dry run counts the same
    rows, writes nothing. Schedules are compacted in id order from after `schedules_after` (a
    loop passes the last pass's `schedules_after`, so bounded passes reach every schedule in
    turn). With `into`, the result is written there as the batches commit: a prune that raises
    mid-way leaves in it what its committed batches removed (the loop reports them)."""
    _check_batch(batch)
    cutoff, now = await cutoff_for(store, older_than)
    result = into if into is not None else PruneResult()
    result.cutoff, result.now, result.dry_run = cutoff, now, dry_run
    result.schedules_after = schedules_after
    if dry_run:
        await _compact_schedules(store, result, batch, max_batches)
        async for job_ids in candidates(store, cutoff, batch):
            result.batches += 1
            async with store.transaction() as tx:
                await _count(tx, result, [*PRUNE_STEPS, JOBS_STEP], {"job_ids": job_ids})
            if max_batches is not None and result.batches >= max_batches:
                break
        owners = owners_per_batch(batch)
        async for agent_job_ids in candidates(
            store, cutoff, owners, which="prune_agent_candidates", callback_urls=callback_urls
        ):
            result.batches += 1
            async with store.transaction() as tx:
                turns = await tx.fetch("agent_turn_jobs", {"agent_job_ids": agent_job_ids})
                turn_ids = [row[0] for row in turns]
                await _count(tx, result, [*PRUNE_STEPS, JOBS_STEP], {"job_ids": turn_ids})
                await _count(tx, result, AGENT_STEPS, {"agent_job_ids": agent_job_ids})
        async for objective_ids in candidates(
            store, cutoff, owners, which="prune_objective_candidates"
        ):
            result.batches += 1
            async with store.transaction() as tx:
                # All its jobs: no job batch takes an objective's job (it goes with it). One a
                # job of which still owes a delivery is kept, as the prune keeps it.
                jobs_of = await _objective_jobs(tx, objective_ids)
                every = [j.job_id for jobs in jobs_of.values() for j in jobs]
                owing = {r[0] for r in await tx.fetch("jobs_owing_deliveries", {"job_ids": every})}
                objective_ids = [
                    o for o in objective_ids if not any(j.job_id in owing for j in jobs_of[o])
                ]
                jobs_of = {o: jobs_of[o] for o in objective_ids}
                theirs = [j.job_id for jobs in jobs_of.values() for j in jobs]
                await _count(tx, result, [*PRUNE_STEPS, JOBS_STEP], {"job_ids": theirs})
                await _count(tx, result, OBJECTIVE_STEPS, {"objective_ids": objective_ids})
        return result
    resume = Resume()
    while max_batches is None or result.batches < max_batches:
        with translate_errors():
            looked_at = resume.looked_at
            removed = await prune_batch(
                store, cutoff, batch, resume=resume, callback_urls=callback_urls
            )
        if not removed and resume.looked_at == looked_at:
            break  # nothing left past the places: a batch that only passed over goes on
        result.batches += 1
        for name, count in removed.items():
            result.add(name, count)
    await _compact_schedules(store, result, batch, max_batches)
    return result


async def _compact_schedules(
    store: Store, result: PruneResult, batch: int, max_batches: int | None
) -> None:
    """Schedules' old firing receipts (`receipts/schedules/compaction.py`), in batches of
    schedules in id order (each batch after the last one's), after the jobs; a dry run counts
    what each would delete."""
    assert result.cutoff is not None and result.now is not None
    cutoff = compaction.cutoff_of(result.cutoff, result.now)
    schedules_per_batch = max(1, batch // 100)
    while max_batches is None or result.batches < max_batches:
        done = await compaction.compact(
            store, cutoff, schedules_per_batch, after=result.schedules_after, dry_run=result.dry_run
        )
        if done.last is None:
            result.schedules_after = ""  # every schedule looked at: the next pass starts over
            return
        result.schedules_after = done.last
        result.batches += 1
        if done.receipts:
            result.add(SCHEDULE_RECEIPTS, done.receipts)


async def _count(
    tx: Tx, result: PruneResult, steps: Sequence[PruneStep], params: dict[str, Any]
) -> None:
    """Add to `result` what each of `steps` would delete for `params` (a dry run)."""
    for step in steps:
        row = await tx.fetch_one(step.count, params)
        result.add(step.name, int(row[0]) if row else 0)


async def export(
    store: Store,
    older_than: Age,
    *,
    batch: int = DEFAULT_BATCH,
    callback_urls: Sequence[str] = (),
) -> AsyncIterator[dict[str, Any]]:
    """Yield what a prune would remove now, one JSON object per line (given the cutoff as a
    time, `cutoff_for`'s, a `prune` given the same removes what was exported):

    - `{jobId, job, receipts}` per job (its folded state and whole chain), oldest settlement
      first;
    - `{agentJobId, agentJob, receipts}` per settled agent job, each followed by its turns'
      queue jobs (job lines);
    - `{objectiveId, objective, receipts}` per settled objective, each followed by its jobs
      (job lines: an objective's jobs go with it, never before it).
    """
    _check_batch(batch)
    cutoff, _ = await cutoff_for(store, older_than)
    async for job_ids in candidates(store, cutoff, batch):
        for line in (await _job_lines(store, job_ids)).values():
            yield line
    owners = owners_per_batch(batch)
    async for agent_job_ids in candidates(
        store, cutoff, owners, which="prune_agent_candidates", callback_urls=callback_urls
    ):
        rows = await store.fetch("export_agent_jobs", {"agent_job_ids": agent_job_ids})
        turns_of: dict[str, list[str]] = {a: [] for a in agent_job_ids}
        for agent_job_id, job_id in await store.fetch(
            "agent_turn_job_ids", {"agent_job_ids": agent_job_ids}
        ):
            turns_of[agent_job_id].append(job_id)
        lines = await _job_lines(store, [j for turns in turns_of.values() for j in turns])
        for line in _with_their_jobs(rows, ("agentJobId", "agentJob"), turns_of, lines):
            yield line
    async for objective_ids in candidates(
        store, cutoff, owners, which="prune_objective_candidates"
    ):
        rows = await store.fetch("export_objectives", {"objective_ids": objective_ids})
        jobs_of = await _objective_jobs(store, objective_ids)
        theirs = {o: [j.job_id for j in jobs] for o, jobs in jobs_of.items()}
        lines = await _job_lines(store, [j for ids in theirs.values() for j in ids])
        for line in _with_their_jobs(rows, ("objectiveId", "objective"), theirs, lines):
            yield line


def _with_their_jobs(
    rows: Iterable[Sequence[Any]],
    keys: tuple[str, str],
    jobs_of: Mapping[str, Sequence[str]],
    lines: Mapping[str, dict[str, Any]],
) -> Iterator[dict[str, Any]]:
    """Each exported agent job or objective (`rows` of id, state, receipts, named by `keys`),
    followed by the lines of its jobs that go with it and are still there."""
    id_key, state_key = keys
    for owner_id, state, receipts in rows:
        yield {id_key: owner_id, state_key: state, "receipts": receipts}
        for job_id in jobs_of[owner_id]:
            if job_id in lines:  # not deleted since
                yield lines[job_id]


async def _job_lines(store: Store, job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The export line of each of these jobs, by id (one query)."""
    if not job_ids:
        return {}
    rows = await store.fetch("export_jobs", {"job_ids": job_ids})
    return {
        job_id: {"jobId": job_id, "job": state, "receipts": receipts}
        for job_id, state, receipts in rows
    }


async def workspace_owners_active(store: Store) -> list[tuple[str, str, str]]:
    """`(organizationId, kind, ownerId)` of every owner whose workspace may be in use (the
    workspace sweep's, activities/workspace_sweep.py): an unsettled job (`jobs`), an active
    objective (`objectives`), an unfinished agent job or one with a turn still running, by its
    workspace owner (`agent-jobs`)."""
    rows = await store.fetch("workspace_owners_active", {})
    return [(str(org), str(kind), str(owner)) for org, kind, owner in rows]
