"""Projections are derived: each projection table holds the folded states of one kind of stream,
is written only in the transaction of the receipts that change a row (`Tx.append_job` for a
job, `Projection.put` for the others), and is rebuilt or verified from the chain here
(`receipt rebuild-projections`). Each aggregate declares its own: `JOBS` here (the store writes
it), `OBJECTIVES` in receipts/objectives/store.py, `AGENT_JOBS` in receipts/agent_jobs/projection.py,
`SCHEDULES` in receipts/schedules/store.py;
receipts/assembly.py lists them all."""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from functools import cache
from typing import Any, Generic, Protocol, TypeVar

from psycopg.types.json import Jsonb

from receipts import jobs
from receipts.jobs import Job
from receipts.kinds import route
from receipts.sql import query
from receipts.streams import Receipt, StreamState, dumps


class Tx(Protocol):
    """What a projection needs of an open transaction (receipts/store.py `Tx`)."""

    async def fetch(self, name: str, params: Mapping[str, Any]) -> Sequence[Sequence[Any]]: ...

    def stream(
        self, name: str, params: Mapping[str, Any]
    ) -> AsyncGenerator[Sequence[Any], None]: ...

    async def execute(self, name: str, params: Mapping[str, Any]) -> int: ...

    async def execute_many(self, name: str, rows: Sequence[Mapping[str, Any]]) -> None: ...


S = TypeVar("S", bound=StreamState)
FOLD_BATCH = 500
"""Streams a rebuild or a verify folds, then writes or compares, at a time."""
_PARAMETER = re.compile(r"%\((\w+)\)s")


@dataclass(frozen=True, slots=True)
class Projection(Generic[S]):
    """The table `table` of the folded states (`model`, folded by `fold`) of the streams
    `<model.STREAM_PREFIX><id>`, one row each; a verify names a row `<noun><id>`.

    Its statements (receipts/sql/) are `write` (one row), `<table>_lock` (the table lock of a
    rebuild), `<table>_clear`, `<table>_states` (the id and state of each row of `keys`) and
    `<table>_unchained` (the ids of rows whose stream holds no receipt). The `write`
    statement names the row's columns: each of its parameters is the state's attribute of that
    name (or what `extra` gives), `state` the whole state as JSON.
    """

    table: str
    model: type[S]
    fold: Callable[[Iterable[Receipt]], S | None]
    write: str
    noun: str = ""
    extra: Callable[[S], dict[str, Any]] | None = None
    # A table written by more than `put` (the jobs' one-statement writes compute their columns
    # apart from `state`): `<table>_rows` gives each row's id, whether a newer lease row holds
    # its lease (`patched`), and these columns, which a verify compares with the fold's row;
    # `patched` rows skip `stale_when_patched` (the heartbeat's columns, kept on the lease row).
    columns: tuple[str, ...] = ()
    stale_when_patched: frozenset[str] = frozenset()

    def row(self, state: S) -> dict[str, Any]:
        """Return the row of a folded state, as the parameters of the `write` statement."""
        given = self.extra(state) if self.extra is not None else {}
        given["state"] = Jsonb(state.to_json(), dumps=dumps)
        return {
            name: given[name] if name in given else getattr(state, name)
            for name in _parameters(self.write)
        }

    async def put(self, tx: Tx, state: S) -> None:
        """Write the row of `state`, in the transaction that appended its receipts."""
        await tx.execute(self.write, self.row(state))

    async def folded_batches(self, tx: Tx) -> AsyncGenerator[tuple[list[str], dict[str, S]], None]:
        """The chain of this kind read in `tx` and folded `FOLD_BATCH` streams at a time: each
        batch's stream ids (one that folds to nothing included) and their folded states. The
        receipts come from a server-side cursor, so however long the chain, one page of it and
        one batch of states are held."""
        prefix = self.model.STREAM_PREFIX
        ids: list[str] = []
        folded: dict[str, S] = {}
        chain: list[Receipt] = []
        # Closed in the transaction even when the caller stops early (an error): its cursor too.
        async with aclosing(tx.stream("read_streams", {"prefix": prefix})) as rows:
            async for row in rows:
                receipt = Receipt.from_row(row)
                if chain and receipt.stream != chain[0].stream:
                    self._fold_into(chain, ids, folded)
                    chain = []
                    if len(ids) >= FOLD_BATCH:
                        yield ids, folded
                        ids, folded = [], {}
                chain.append(receipt)
        if chain:
            self._fold_into(chain, ids, folded)
        if ids:
            yield ids, folded

    def _fold_into(self, chain: list[Receipt], ids: list[str], folded: dict[str, S]) -> None:
        ids.append(chain[0].stream.removeprefix(self.model.STREAM_PREFIX))
        state = self.fold(chain)
        if state is not None:
            folded[state.stream_id] = state

    async def rebuild_in(self, tx: Tx) -> int:
        """Replace the table with the fold of the chain; appends wait on the table lock
        meanwhile, so the rows are the fold of a consistent chain. Returns the rows written."""
        await tx.execute(f"{self.table}_lock", {})
        await tx.execute(f"{self.table}_clear", {})
        written = 0
        async with aclosing(self.folded_batches(tx)) as batches:
            async for _, folded in batches:
                await tx.execute_many(self.write, [self.row(s) for s in folded.values()])
                written += len(folded)
        return written

    async def verify_in(self, tx: Tx) -> list[str]:
        """One line per row that is not the fold of its stream (or has no stream, or no row);
        `tx` reads one snapshot (`receipts.assembly.verify`). Compared a batch of streams at a
        time, then the rows whose stream holds no receipt."""
        problems: list[tuple[str, str]] = []
        async with aclosing(self.folded_batches(tx)) as batches:
            async for ids, folded in batches:
                rows = await tx.fetch(f"{self.table}_states", {"keys": ids})
                live = {row[0]: self.model.model_validate(row[1]) for row in rows}
                problems += [
                    (key, "in the projection but not in the chain")
                    for key in live.keys() - folded.keys()
                ]
                problems += [
                    (key, "in the chain but not in the projection")
                    for key in folded.keys() - live.keys()
                ]
                problems += [
                    (key, "projection differs from the fold of its chain")
                    for key in folded.keys() & live.keys()
                    if folded[key] != live[key]
                ]
                if self.columns:
                    rows = await tx.fetch(f"{self.table}_rows", {"keys": ids})
                    problems += self._column_problems(rows, folded)
        unchained = await tx.fetch(f"{self.table}_unchained", {"prefix": self.model.STREAM_PREFIX})
        problems += [(row[0], "in the projection but not in the chain") for row in unchained]
        return [f"{self.noun}{key}: {problem}" for key, problem in sorted(problems)]

    def _column_problems(
        self, rows: Sequence[Sequence[Any]], folded: Mapping[str, S]
    ) -> list[tuple[str, str]]:
        """The columns of each row (`<table>_rows`) that are not the fold's row's."""
        problems: list[tuple[str, str]] = []
        for key, patched, *values in rows:
            state = folded.get(key)
            if state is None:
                continue  # reported above: in the projection but not in the chain
            expected = self.row(state)
            for name, value in zip(self.columns, values, strict=True):
                if patched and name in self.stale_when_patched:
                    continue
                if value != expected[name]:
                    problems.append(
                        (key, f"column {name} is {value!r}, the fold's {expected[name]!r}")
                    )
        return problems


@cache
def _parameters(name: str) -> tuple[str, ...]:
    """The parameters the statement `name` takes (outside its comments), in order, each once."""
    code = [line for line in query(name).splitlines() if not line.lstrip().startswith("--")]
    return tuple(dict.fromkeys(_PARAMETER.findall("\n".join(code))))


def _job_columns(job: Job) -> dict[str, Any]:
    return {
        "lease_expires_at": job.lease.expires_at if job.lease else None,
        "worker_queue": route(job.agent_id, job.kind),
    }


JOBS = Projection(
    "jobs",
    Job,
    jobs.fold,
    "jobs_insert",
    extra=_job_columns,
    columns=(
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
        "lease_expires_at",
        "last_heartbeat_at",
        "created_at",
        "updated_at",
        "worker_queue",
    ),
    stale_when_patched=frozenset({"seq", "updated_at", "last_heartbeat_at"}),
)
