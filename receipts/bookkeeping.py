"""Best-effort bookkeeping off the hot path: one writer per store (per process) for the rows that
describe deliveries — the workflow and activity ledgers and the driver's generation record.

A caller queues a row (`submit`, no wait) and goes on; the writer sends what has queued, in the
order it was queued, as one pipeline — one round trip for the batch — up to half a second later
(`LINGER_S`), so the rows of an attempt's start and settle, and of the jobs around it, travel
together; a generation record is written at once (`write_now`), with the rows queued before
it, as the next dispatch of its job reads it. Rows of one key keep their order (a ledger row's
`started` is never written after its `completed`). The spec's rule for the ledger holds for
every row: one that cannot be written is logged (`bookkeeping.write_failed`) and counted
(`receipt_ledger_write_failures_total`) and dropped — the whole batch when the database cannot
be reached, only the refused row otherwise (the batch is then written row by row) — and it
never touches a receipt, which the job's own statements wrote already (docs/rules.md, X9).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import Counter
from collections.abc import Mapping
from typing import Any

from receipts import metrics
from receipts.errors import StorageError, TransientStorageError
from receipts.sql import query
from receipts.store import Store

log = logging.getLogger("receipts.bookkeeping")

# How long the writer lets ledger rows gather after the first one queues (nobody waits on
# them: at a few jobs a second a batch holds several jobs' rows), and the most it sends at once.
LINGER_S = 0.5
MAX_BATCH = 500

# The bookkeeping statements (receipts/sql/delivery.sql); failures are counted by statement.
STATEMENTS = frozenset({"ledger_workflow", "ledger_activity", "delivery_record"})


class Bookkeeper:
    """The one bookkeeping writer of a store; `writer(store)` returns it."""

    def __init__(self, store: Store, linger_s: float = LINGER_S) -> None:
        self.store = store
        self.linger_s = linger_s
        self._rows: list[tuple[str, Mapping[str, Any]]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queued = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._flushing = asyncio.Lock()

    def submit(self, statement: str, params: Mapping[str, Any]) -> None:
        """Queue one row of a bookkeeping statement (`STATEMENTS`): written within `linger_s`,
        with whatever queued meanwhile."""
        self._queue(statement, params)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="bookkeeping-writer")

    async def write_now(self, statement: str, params: Mapping[str, Any]) -> None:
        """Write one row now — with every row queued before it, in the same round trip — and
        return when it is written (or counted as lost): the generation record, which the next
        dispatch of the job reads."""
        self._queue(statement, params)
        await self.flush()

    def _queue(self, statement: str, params: Mapping[str, Any]) -> None:
        if statement not in STATEMENTS:
            raise ValueError(f"{statement} is not a bookkeeping statement")
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first use, or a new event loop (a test's)
            self._loop, self._queued, self._flushing = loop, asyncio.Event(), asyncio.Lock()
            self._task = None
        self._rows.append((statement, params))
        self._queued.set()

    async def flush(self) -> None:
        """Write everything queued so far (in batches of `MAX_BATCH`), in queue order."""
        async with self._flushing:
            while self._rows:
                batch, self._rows = self._rows[:MAX_BATCH], self._rows[MAX_BATCH:]
                await self._write(batch)

    async def close(self) -> None:
        """Write what is queued and stop the writer (the store closes after this)."""
        if self._task is not None and self._loop is asyncio.get_running_loop():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.flush()

    async def _run(self) -> None:
        while True:
            await self._queued.wait()
            await asyncio.sleep(self.linger_s)
            self._queued.clear()
            await self.flush()

    async def _write(self, batch: list[tuple[str, Mapping[str, Any]]]) -> None:
        metrics.BOOKKEEPING_BATCH.observe(len(batch))
        try:
            async with self.store.connection() as conn, conn.pipeline():
                for statement, params in batch:
                    await conn.execute(query(statement), params)
            return
        except TransientStorageError as exc:  # no database to write to: the batch is lost
            self._lost(batch, exc)
            return
        except StorageError:  # one row the database refused: the others are written one by one
            pass
        for row in batch:
            try:
                async with self.store.connection() as conn:
                    await conn.execute(query(row[0]), row[1])
            except StorageError as exc:
                self._lost([row], exc)

    @staticmethod
    def _lost(rows: list[tuple[str, Mapping[str, Any]]], exc: Exception) -> None:
        lost = Counter(statement for statement, _ in rows)
        for statement, count in lost.items():
            metrics.LEDGER_FAILURES.labels(statement).inc(count)
        log.warning(
            "bookkeeping rows not written; dropped",
            extra={
                "event": "bookkeeping.write_failed",
                "rows": len(rows),
                "statements": dict(lost),
                "error": str(exc),
            },
        )


_WRITERS: weakref.WeakKeyDictionary[Store, Bookkeeper] = weakref.WeakKeyDictionary()


def writer(store: Store) -> Bookkeeper:
    """The store's bookkeeping writer (created on first use; flushed when the store closes)."""
    found = _WRITERS.get(store)
    if found is None:
        found = _WRITERS[store] = Bookkeeper(store)
        store.before_close(found.close)
    return found
