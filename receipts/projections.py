"""Projections are derived: each projection table holds the folded states of one kind of stream,
is written only in the transaction of the receipts that change a row (`Tx.append_job` for a
job, `Projection.put` for the others), and is rebuilt or verified from the chain here
(`receipt rebuild-projections`)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from psycopg.types.json import Jsonb

from receipts import jobs
from receipts.agent_jobs import model as agent_model
from receipts.agent_jobs.model import AgentJob
from receipts.jobs import Job
from receipts.objectives import model as objective_model
from receipts.objectives.model import ObjectiveState
from receipts.sql import query
from receipts.streams import Receipt, StreamState, dumps

if TYPE_CHECKING:
    from receipts.store import Store, Tx

log = logging.getLogger("receipts.projections")

S = TypeVar("S", bound=StreamState)


@dataclass(frozen=True, slots=True)
class Projection(Generic[S]):
    """The table `table` of the folded states of the streams `<prefix><id>`, one row each.

    A row's columns are the state's attributes named in `columns` (and what `extra` adds), with
    the whole state as JSON in `state`. Its statements (receipts/sql/) are `write` (one row),
    `<table>_lock` and `<table>_share_lock` (the table lock of a rebuild, of a verify),
    `<table>_clear` and `<table>_states` (each row's `key` and state).
    """

    table: str
    prefix: str
    noun: str  # how a difference names a row: "<noun><key>: ..."
    model: type[S]
    fold: Callable[[Iterable[Receipt]], S | None]
    key: str
    columns: tuple[str, ...]
    write: str
    extra: Callable[[S], dict[str, Any]] | None = None

    def row(self, state: S) -> dict[str, Any]:
        """Return the row of a folded state, as statement parameters."""
        row = {column: getattr(state, column) for column in self.columns}
        if self.extra is not None:
            row.update(self.extra(state))
        row["state"] = Jsonb(state.to_json(), dumps=dumps)
        return row

    async def put(self, tx: Tx, state: S) -> None:
        """Write the row of `state`, in the transaction that appended its receipts."""
        await tx.conn.execute(query(self.write), self.row(state))

    async def fold_chain_in(self, conn: Any) -> dict[str, S]:
        """Fold every stream of this kind, read through `conn` (a caller's transaction)."""
        cur = await conn.execute(query("read_streams"), {"prefix": self.prefix})
        rows = [Receipt.from_row(row) for row in await cur.fetchall()]
        folded: dict[str, S] = {}
        for _, receipts in itertools.groupby(rows, key=lambda r: r.stream):
            state = self.fold(receipts)
            if state is not None:
                folded[getattr(state, self.key)] = state
        return folded

    async def rebuild_in(self, conn: Any) -> int:
        """Replace the table with the fold of the chain; appends wait on the table lock
        meanwhile, so the rows are the fold of a consistent chain. Returns the rows written."""
        await conn.execute(query(f"{self.table}_lock"), {})
        folded = await self.fold_chain_in(conn)
        await conn.execute(query(f"{self.table}_clear"), {})
        async with conn.cursor() as cur:
            await cur.executemany(query(self.write), [self.row(s) for s in folded.values()])
        return len(folded)

    async def verify_in(self, conn: Any) -> list[str]:
        """One line per row that is not the fold of its stream (or has no stream, or no row)."""
        await conn.execute(query(f"{self.table}_share_lock"), {})
        folded = await self.fold_chain_in(conn)
        cur = await conn.execute(query(f"{self.table}_states"), {})
        live = {row[0]: self.model.model_validate(row[1]) for row in await cur.fetchall()}
        problems = [
            (key, "in the projection but not in the chain") for key in live.keys() - folded.keys()
        ]
        problems += [
            (key, "in the chain but not in the projection") for key in folded.keys() - live.keys()
        ]
        problems += [
            (key, "projection differs from the fold of its chain")
            for key in folded.keys() & live.keys()
            if folded[key] != live[key]
        ]
        return [f"{self.noun}{key}: {problem}" for key, problem in sorted(problems)]


def _lease_expires_at(job: Job) -> dict[str, Any]:
    return {"lease_expires_at": job.lease.expires_at if job.lease else None}


JOBS = Projection(
    table="jobs",
    prefix=jobs.JOB_STREAM_PREFIX,
    noun="",
    model=Job,
    fold=jobs.fold,
    key="job_id",
    columns=(
        "job_id",
        "seq",
        "organization_id",
        "session_key",
        "agent_id",
        "lane",
        "kind",
        "status",
        "attempt",
        "max_attempts",
        "abort_requested",
        "available_at",
        "last_heartbeat_at",
        "created_at",
        "updated_at",
    ),
    write="jobs_insert",
    extra=_lease_expires_at,
)
OBJECTIVES = Projection(
    table="objectives",
    prefix=objective_model.STREAM_PREFIX,
    noun="objective ",
    model=ObjectiveState,
    fold=objective_model.fold,
    key="objective_id",
    columns=(
        "objective_id",
        "organization_id",
        "seq",
        "status",
        "phase",
        "title",
        "control_requested_seq",
        "control_delivered_seq",
        "reconciled_seq",
        "created_at",
        "updated_at",
    ),
    write="objective_upsert",
)
AGENT_JOBS = Projection(
    table="agent_jobs",
    prefix=agent_model.STREAM_PREFIX,
    noun="agent job ",
    model=AgentJob,
    fold=agent_model.fold,
    key="agent_job_id",
    columns=(
        "agent_job_id",
        "seq",
        "organization_id",
        "agent_id",
        "owner_session_id",
        "source_tool_call_id",
        "status",
        "attempt",
        "turn",
        "consecutive_failures",
        "available_at",
        "answer_pending",
        "cancel_requested",
        "queue_job_id",
        "created_at",
        "updated_at",
    ),
    write="agent_job_upsert",
)


async def rebuild_tables(store: Store, *projections: Projection[Any]) -> dict[str, int]:
    """Rebuild each projection from the chain, all in one transaction; return rows per table."""
    async with store.transaction() as tx:
        counts = {p.table: await p.rebuild_in(tx.conn) for p in projections}
    log.info("projections rebuilt", extra={"event": "projections.rebuilt", **counts})
    return counts


async def verify_tables(store: Store, *projections: Projection[Any]) -> list[str]:
    """Compare each live projection with the fold of the chain, in one transaction; return one
    line per difference."""
    async with store.transaction() as tx:
        return [line for p in projections for line in await p.verify_in(tx.conn)]


async def rebuild(store: Store) -> int:
    """Replace the `jobs` and `objectives` projections with the fold of the chain, in one
    transaction. Returns the number of jobs written."""
    return (await rebuild_tables(store, JOBS, OBJECTIVES))["jobs"]


async def verify(store: Store) -> list[str]:
    """Compare the `jobs` and `objectives` projections with the fold of the chain."""
    return await verify_tables(store, JOBS, OBJECTIVES)
