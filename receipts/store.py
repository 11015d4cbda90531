"""The receipt store: fenced appends, stream reads and the jobs projection on PostgreSQL (psycopg 3)."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, TypeVar

import psycopg
import psycopg.errors
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from receipts import jobs as jobmodel
from receipts.errors import (
    ConflictError,
    NotFoundError,
    StorageError,
    TransientStorageError,
    UnansweredStorageError,
)
from receipts.job_append import insert_params, numbered, plan
from receipts.jobs import Job, Receipt
from receipts.pool import CHECK_IDLE_S, SESSION_SETTINGS, Pool
from receipts.sql import query
from receipts.streams import Draft

log = logging.getLogger("receipts.store")

T = TypeVar("T")


@dataclass(frozen=True)
class SettlementPolicy:
    """What a layer above the store does in the very transaction of a job's append, given the
    job before it (None for a new job), after it, and the receipts appended: the Factory's
    control outbox (receipts/objectives/store.py `CONTROL_OUTBOX`). `wants` says, without a
    round trip, whether it has anything to do (an append no policy wants may be one guarded
    statement: receipts/guarded.py); `lock` takes its locks before the job is written (whose
    write locks its organization's open-jobs counter row: the transaction's last lock), `write`
    writes after. The process registers the policies (receipts/assembly.py)."""

    wants: Callable[[Job | None, Job, Sequence[Draft]], bool]
    write: Callable[[Tx, Job | None, Job, Sequence[Draft]], Awaitable[None]]
    lock: Callable[[Tx, Job], Awaitable[None]] | None = None


_TRANSIENT_SQLSTATES = {
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "55P03",  # lock_not_available
    "57014",  # query_canceled (a statement_timeout: the api's bounded queries)
    "57P01",  # admin_shutdown
    "57P02",  # crash_shutdown
    "57P03",  # cannot_connect_now
    "53300",  # too_many_connections
    *("08000", "08003", "08006", "08001", "08004"),  # connection exceptions
}


@contextmanager
def translate_errors() -> Iterator[None]:
    """Translate psycopg errors into the project's own at the store boundary."""
    try:
        yield
    except psycopg.errors.UniqueViolation as exc:
        raise ConflictError(str(exc)) from exc
    except PoolTimeout as exc:
        raise TransientStorageError(f"no database connection available: {exc}") from exc
    except psycopg.OperationalError as exc:
        if (exc.sqlstate or "").startswith("54"):  # a program limit (a row too large): no retry
            raise StorageError(str(exc)) from exc
        raise TransientStorageError(str(exc)) from exc
    except psycopg.Error as exc:
        if exc.sqlstate in _TRANSIENT_SQLSTATES:
            raise TransientStorageError(str(exc)) from exc
        raise StorageError(str(exc)) from exc


@contextmanager
def unanswered(conn: psycopg.AsyncConnection[TupleRow]) -> Iterator[None]:
    """A failure that broke `conn` (checked out, so a statement or a commit was in flight):
    `UnansweredStorageError`, its write perhaps made (the answer to a commit is what was lost).
    Whatever psycopg calls it: behind PgBouncer a backend that ended mid-transaction leaves its
    FATAL error and the pooler's own (`server conn crashed?`) queued, and the COMMIT read two
    results (`InternalError: received 2 results from command 'COMMIT'`: a StorageError before,
    a 500 and no retry)."""
    try:
        yield
    except (psycopg.Error, TransientStorageError) as exc:
        if conn.broken and not isinstance(exc, UnansweredStorageError):
            raise UnansweredStorageError(str(exc)) from exc
        raise


@dataclass
class Tx:
    """One open transaction. Every write of a job goes through `append_job` under its row lock;
    every other statement is a named one (receipts/sql/) run by `fetch`, `fetch_one`, `execute`
    or `execute_many`. The connection is the transaction's own."""

    _conn: psycopg.AsyncConnection[TupleRow]
    _policies: Sequence[SettlementPolicy] = ()
    _owe_callbacks: bool = True
    _now: datetime | None = None
    appended: list[Receipt] = field(default_factory=list)
    _locked_streams: set[str] = field(default_factory=set)

    async def now(self) -> datetime:
        """Return the database clock for this transaction (constant within it: `now()`)."""
        if self._now is None:
            row = await self._one(query("now"), {})
            self._now = row[0]
        return self._now

    def clock_read(self, now: datetime) -> None:
        """The transaction's clock as a statement of it read it (`now()` is constant within a
        transaction): `now` asks the database no more."""
        self._now = now

    async def lock_key(self, key: str) -> None:
        """Take a transaction-scoped advisory lock on `key` (released at commit or rollback)."""
        await self._conn.execute(query("lock_key"), {"key": key})

    async def try_lock_key(self, key: str) -> bool:
        """`lock_key` without waiting: True when taken, False when another transaction holds it
        (a single-flight pass across processes skips then)."""
        cur = await self._conn.execute(query("try_lock_key"), {"key": key})
        row = await cur.fetchone()
        return bool(row and row[0])

    async def job_for_update(self, job_id: str) -> Job | None:
        """Lock and return the job's projection row (None if the job does not exist). Locked by
        one statement, read by the next (one round trip): see queries.sql `job_lock`."""
        async with self._conn.pipeline():
            await self._conn.execute(query("job_lock"), {"job_id": job_id})
            cur = await self._conn.execute(query("job_for_update"), {"job_id": job_id})
        row = await cur.fetchone()
        if row is None:
            await self.now()
            return None
        self._now = row[0]
        return Job.model_validate(row[1])

    async def job_with_now(self, job_id: str) -> tuple[Job | None, datetime]:
        """The job's folded state (or None) and the database clock, in one round trip."""
        row = await self._one(query("job_get_with_now"), {"job_id": job_id})
        return (Job.model_validate(row[1]) if row[1] is not None else None), row[0]

    async def job(self, job_id: str) -> Job | None:
        """Return the job without locking it."""
        row = await self._maybe_one(query("job_get"), {"job_id": job_id})
        return Job.model_validate(row[0]) if row else None

    async def job_by_command(self, command_id: str) -> Job | None:
        """Return the job that received the queue command `command_id`, if any."""
        row = await self._maybe_one(query("job_by_command"), {"command_id": command_id})
        return Job.model_validate(row[0]) if row else None

    async def session_active_for_update(
        self, organization_id: str | None, session_key: str
    ) -> list[Job]:
        """Lock (in jobId order) and return the active jobs on an organization's session key
        (locked by one statement and read by the next, as `job_for_update`)."""
        params = {"organization_id": organization_id, "session_key": session_key}
        async with self._conn.pipeline():
            await self._conn.execute(query("session_active_lock"), params)
            cur = await self._conn.execute(query("session_active_for_update"), params)
        return [Job.model_validate(row[0]) for row in await cur.fetchall()]

    async def append_job(
        self, job_id: str, job: Job | None, drafts: Sequence[Draft]
    ) -> tuple[Job, list[Receipt]]:
        """Fold `drafts` onto `job` (locked by the caller), append them and update the projection.

        Returns the new state and the receipts written. The reducer runs here, so a draft it
        would refuse raises `InvariantError` before anything is written.
        """
        planned = plan(job_id, job, drafts, await self.now(), owe_callbacks=self._owe_callbacks)
        # Here, the one place every job receipt is written: what a policy writes commits with
        # these receipts, or neither does.
        wanted = [p for p in self._policies if p.wants(job, planned.folded, planned.drafts)]
        for policy in wanted:
            if policy.lock is not None:
                await policy.lock(self, planned.folded)
        stored = await self._insert(planned.statement, planned.receipts, planned.params)
        for policy in wanted:
            await policy.write(self, job, planned.folded, planned.drafts)
        return planned.folded, stored

    async def lock_streams(self, streams: Sequence[str]) -> None:
        """Lock streams for appending, in one global order (by name), so that two multi-stream
        appends can never deadlock on each other. Locks are held until commit or rollback."""
        for stream in sorted(set(streams)):
            if stream not in self._locked_streams:
                await self.lock_key(f"stream:{stream}")
                self._locked_streams.add(stream)

    async def lock_stream_if(self, stream: str, name: str, params: Mapping[str, Any]) -> bool:
        """Lock `stream` as `lock_streams` does, only if the named statement — which takes the
        advisory lock on `key` for the row it finds — finds one; False (no lock) otherwise."""
        if stream in self._locked_streams:
            return True
        row = await self._maybe_one(query(name), {**params, "key": f"stream:{stream}"})
        if row is None:
            return False
        self._locked_streams.add(stream)
        return True

    async def append(
        self, stream: str, drafts: Sequence[Draft], *, expected_seq: int | None = None
    ) -> list[Receipt]:
        """Append `drafts` to any stream other than a job's (jobs go through `append_job`).

        Takes the stream's lock if the caller has not (`lock_streams` first when one transaction
        appends to several). `expected_seq` is the optimistic version: the stream's last seq the
        caller folded; a different head raises `ConflictError` and nothing is written. Returns
        the receipts as stored (consecutive seqs after the head, positions, the database time).
        """
        if not drafts:
            raise ValueError("append needs at least one receipt")
        if stream.startswith(jobmodel.job_stream("")):
            raise ValueError(f"{stream}: job streams are appended with append_job")
        await self.lock_streams([stream])
        now = await self.now()
        head = (await self._one(query("stream_head"), {"stream": stream}))[0]
        if expected_seq is not None and head != expected_seq:
            raise ConflictError(f"{stream} is at seq {head}, expected {expected_seq}")
        return await self._insert("append_stream", numbered(stream, head, drafts, now), {})

    async def _insert(
        self, name: str, receipts: list[Receipt], params: dict[str, Any]
    ) -> list[Receipt]:
        """Run the append statement `name` (each inserts the receipts of one stream and NOTIFYs
        it; `params` are its other parameters). Returns the receipts as stored, with positions."""
        params = insert_params(receipts, params)
        positions: list[int] = (await self._one(query(name), params))[0]
        stored = [replace(r, position=p) for r, p in zip(receipts, positions, strict=True)]
        self.appended.extend(stored)
        return stored

    async def read_stream(self, stream: str, after_seq: int = 0) -> list[Receipt]:
        """Return a stream's receipts after `after_seq`, in seq order (within this transaction)."""
        cur = await self._conn.execute(
            query("read_stream"), {"stream": stream, "after_seq": after_seq, "limit": 1_000_000}
        )
        return [Receipt.from_row(row) for row in await cur.fetchall()]

    async def fetch(self, name: str, params: Mapping[str, Any]) -> list[TupleRow]:
        """Run the named statement `name` (receipts/sql/) in this transaction; its rows (none
        for a statement that returns none)."""
        cur = await self._conn.execute(query(name), params)
        return list(await cur.fetchall()) if cur.description else []

    async def stream(self, name: str, params: Mapping[str, Any]) -> AsyncGenerator[TupleRow]:
        """The rows of the named statement `name`, fetched a page at a time from a server-side
        cursor: however many there are, this transaction holds one page."""
        async with self._conn.cursor(name=f"receipt_{name}") as cur:
            await cur.execute(query(name), params)
            async for row in cur:
                yield row

    async def fetch_one(self, name: str, params: Mapping[str, Any]) -> TupleRow | None:
        """Run the named statement `name` (receipts/sql/) in this transaction; its first row."""
        return await self._maybe_one(query(name), params)

    async def execute(self, name: str, params: Mapping[str, Any]) -> int:
        """Run the named statement `name` in this transaction; the rows it changed."""
        cur = await self._conn.execute(query(name), params)
        return cur.rowcount

    async def execute_many(self, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run the named statement `name` once per parameter set in `rows`, in one batch."""
        async with self._conn.cursor() as cur:
            await cur.executemany(query(name), rows)

    async def _one(self, sql: str, params: Mapping[str, Any]) -> TupleRow:
        row = await self._maybe_one(sql, params)
        if row is None:
            raise NotFoundError(f"statement returned no row: {sql.splitlines()[0]}")
        return row

    async def _maybe_one(self, sql: str, params: Mapping[str, Any]) -> TupleRow | None:
        cur = await self._conn.execute(sql, params)
        return await cur.fetchone()


class Store:
    """The receipt store over an async connection pool."""

    def __init__(
        self,
        pool: AsyncConnectionPool[psycopg.AsyncConnection[TupleRow]],
        *,
        policies: Sequence[SettlementPolicy],
        owe_callbacks: bool = True,
    ) -> None:
        self._pool = pool
        self.policies = tuple(policies)
        self.owe_callbacks = owe_callbacks
        self._before_close: list[Callable[[], Awaitable[None]]] = []

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        open_timeout: float = 15.0,
        check_idle_s: float = CHECK_IDLE_S,
        unreachable_wait_s: float | None = None,
        session: Mapping[str, str] | None = None,
        prepare: bool = True,
        policies: Sequence[SettlementPolicy],
        owe_callbacks: bool = True,
        on_connect: Callable[[], object] | None = None,
    ) -> Store:
        """Open a pool on `url` and wait until it has a connection; returns the store, which
        runs `policies` in every job append (`receipts.assembly.open_store` opens one with the
        runtime's policies; a test of the bare store names none).

        The pool (receipts/pool.py) replaces a connection a restart broke (`check_idle_s`) and,
        given `unreachable_wait_s`, waits no longer while the database cannot be reached. Each
        new connection gets the settings in `session` (`SESSION_SETTINGS` unless given), then
        `on_connect` is called (the listener: the database is back). `prepare=False`: no
        statement becomes a server-side prepared one, which a transaction-mode pooler breaks
        (the next transaction's server connection lacks it, or holds another of its name). With
        `owe_callbacks` (a callback URL is configured) a job's settle leaves its terminal
        callback owed in `callback_outbox`; without, no row is written for nobody to post."""
        settings = dict(SESSION_SETTINGS if session is None else session)

        async def configure(conn: psycopg.AsyncConnection[TupleRow]) -> None:
            if settings:
                names, values = list(settings), list(settings.values())
                await conn.execute(query("session_settings"), {"names": names, "values": values})
            if on_connect is not None:
                on_connect()

        pool = Pool(
            url,
            min_size=min_size,
            max_size=max_size,
            kwargs={"autocommit": True, **({} if prepare else {"prepare_threshold": None})},
            open=False,
            timeout=10.0,
            check_idle_s=check_idle_s,
            unreachable_wait_s=unreachable_wait_s,
            configure=configure,
        )
        with translate_errors():
            await pool.open(wait=True, timeout=open_timeout)
        return cls(pool, policies=policies, owe_callbacks=owe_callbacks)

    def before_close(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Have `close` await `callback` first (a writer above the store flushing its rows)."""
        self._before_close.append(callback)

    async def close(self) -> None:
        """Run the `before_close` callbacks, then close the pool."""
        for callback in self._before_close:
            try:
                await callback()
            except Exception:  # a writer's failure must not keep the pool open
                log.exception("store close callback failed", extra={"event": "store.close_hook"})
        await self._pool.close()

    @asynccontextmanager
    async def _writing(self) -> AsyncGenerator[psycopg.AsyncConnection[TupleRow]]:
        """A pooled connection for statements that may write: errors translated, and a failure
        that broke it with a statement in flight raised as `UnansweredStorageError`."""
        with translate_errors():
            async with self._pool.connection() as conn:
                with unanswered(conn):
                    yield conn

    @asynccontextmanager
    async def transaction(self) -> AsyncGenerator[Tx]:
        """Open one transaction; it commits when the block ends, rolls back on an exception."""
        async with self._writing() as conn, conn.transaction():
            yield Tx(conn, self.policies, _owe_callbacks=self.owe_callbacks)

    @asynccontextmanager
    async def session(self) -> AsyncGenerator[Tx]:
        """One pooled connection and no transaction: each statement commits on its own. For the
        read and the guarded write of a one-statement change (receipts/guarded.py), which hold
        no lock between them: one checkout, so at most one pool check, for both."""
        async with self._writing() as conn:
            yield Tx(conn, self.policies, _owe_callbacks=self.owe_callbacks)

    async def in_transaction(self, work: Callable[[Tx], Awaitable[T]]) -> T:
        """Run `work` in one transaction and return its result."""
        async with self.transaction() as tx:
            return await work(tx)

    async def get_job(self, job_id: str) -> Job | None:
        """Return the job's folded state from the projection, or None."""
        with translate_errors():
            async with self._pool.connection() as conn:
                cur = await conn.execute(query("job_get"), {"job_id": job_id})
                row = await cur.fetchone()
        return Job.model_validate(row[0]) if row else None

    async def get_job_with_now(self, job_id: str) -> tuple[Job | None, datetime]:
        """Return the job's folded state (or None) and the database clock, in one round trip."""
        async with self.session() as session:
            return await session.job_with_now(job_id)

    async def read_stream(
        self, stream: str, after_seq: int = 0, limit: int = 10_000
    ) -> list[Receipt]:
        """Return the stream's receipts with `seq > after_seq`, in order."""
        with translate_errors():
            async with self._pool.connection() as conn:
                cur = await conn.execute(
                    query("read_stream"),
                    {"stream": stream, "after_seq": after_seq, "limit": limit},
                )
                return [Receipt.from_row(r) for r in await cur.fetchall()]

    async def read_all(self, after_position: int = 0, limit: int = 1_000) -> list[Receipt]:
        """Return receipts of every stream with `position > after_position`, in position order."""
        with translate_errors():
            async with self._pool.connection() as conn:
                cur = await conn.execute(
                    query("read_all"), {"after_position": after_position, "limit": limit}
                )
                return [Receipt.from_row(r) for r in await cur.fetchall()]

    async def fetch(
        self, name: str, params: Mapping[str, Any], *, prepare: bool | None = None
    ) -> list[TupleRow]:
        """Run the named statement `name` (receipts/sql/) on its own and return its rows (none
        for a statement that returns none). `prepare=False` keeps it from becoming a server-side
        prepared statement (whose generic plan may ignore a partial index)."""
        async with self._writing() as conn:
            cur = await conn.execute(query(name), params, prepare=prepare)
            return list(await cur.fetchall()) if cur.description else []

    async def fetch_one(self, name: str, params: Mapping[str, Any]) -> TupleRow | None:
        """Run the named statement `name` and return its first row, or None."""
        rows = await self.fetch(name, params)
        return rows[0] if rows else None

    async def held_settings(self, names: Sequence[str]) -> dict[str, str]:
        """The settings of `names` a session of this pool has (from the server, its database
        and its role), in `pg_settings`' units: statement_timeout in milliseconds."""
        rows = await self.fetch("session_settings_held", {"names": list(names)})
        return {str(name): str(value) for name, value in rows}

    async def ping(self) -> None:
        """One round trip to the database (`SELECT 1`); raises a storage error when it fails."""
        await self.fetch("ping", {})

    @asynccontextmanager
    async def connection(self) -> AsyncGenerator[psycopg.AsyncConnection[TupleRow]]:
        """A pooled connection itself, for tests and development tools that look at one (its
        backend, its settings); the product asks for named operations. Errors are translated."""
        with translate_errors():
            async with self._pool.connection() as conn:
                yield conn

    async def now(self) -> datetime:
        """Return the database clock."""
        with translate_errors():
            async with self._pool.connection() as conn:
                cur = await conn.execute(query("now"), {})
                row = await cur.fetchone()
        assert row is not None
        return row[0]
