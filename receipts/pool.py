"""The store's connection pool: psycopg_pool's, checking a connection at checkout only when it
may be broken (idle a while, or its backend sent it something), and every idle one at once after
one was found dead. `receipts.store.Store.open` builds it."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import select
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool
from psycopg_pool.base import AttemptWithBackoff

from receipts import metrics

log = logging.getLogger("receipts.store")


# The pool's check at checkout, in one place (README's "Choices where the specification or the
# design left room" says it to users).
# A connection made or back in the pool less than this ago, with nothing sent to it since, is
# handed out without the check (a round trip); under load connections come back within
# milliseconds. A backend that ends (a database restart or failover, `pg_terminate_backend`)
# sends its FATAL error and closes the socket, so its connection has input while idle: it is
# checked, fails, and is replaced, and the pool checks every other idle connection at once (the
# others most likely ended with it), so a checkout waits about a second after a restart instead
# of one backoff per dead connection. A connection idle this long or more is checked by round
# trip whatever its socket says. What remains is a backend that ends in the instant between the
# checkout and the first statement: that statement fails once as a transient error, as it
# would after a round-trip check.
CHECK_IDLE_S = 1.0


# psycopg_pool doubles the delay between its attempts to replace a lost connection with no
# ceiling (1, 2, 4, 8, 16, 32 s…): after a 20 s database outage its next attempt came 11 s after
# the database was back, and meanwhile the api answered 503 and every worker's writes waited.
# Attempts go on at most this far apart (one connect per pool slot: cheap).
RECONNECT_MAX_DELAY_S = 2.0
# A pool given `unreachable_wait_s` (the api's) fails its waiting checkouts when an attempt to
# connect fails, and while the database cannot be reached (no attempt has succeeded since) a
# checkout waits at most that long, not the pool's whole timeout: the api answers 503 with
# Retry-After within about a second of a PostgreSQL outage, not after 10 s with every request
# meanwhile held open. A pool that is only busy (every connection in use, the database
# answering) still waits its whole timeout.
UNREACHABLE_WAIT_S = 1.0
# An attempt to grow the pool (every connection it holds in use) is refused by a database that
# answers them, at its connection limit: no outage, so the pool waits on. An attempt to replace
# a connection the pool lost is what tells one.
_growing: contextvars.ContextVar[bool] = contextvars.ContextVar("growing", default=False)
# Every application connection: no JIT. Our statements are short index lookups whose cost
# estimates can still cross jit_above_cost on a large table, where compiling costs more (tens of
# milliseconds) than the statement.
SESSION_SETTINGS: Mapping[str, str] = {"jit": "off"}


def has_input(conn: psycopg.AsyncConnection[TupleRow]) -> bool:
    """Whether an idle connection's socket has something to read, or is gone: what a backend
    that ended sent it (its FATAL error, the end of the stream). One poll, no round trip."""
    if conn.closed:
        return True
    try:
        fd = conn.fileno()
    except psycopg.OperationalError:
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


class Pool(AsyncConnectionPool[psycopg.AsyncConnection[TupleRow]]):
    """The psycopg pool, remembering when each connection was made or came back (a `reset`
    callback would do the latter, but makes the pool return every connection through its
    background workers)."""

    def __init__(
        self,
        *args: Any,
        check_idle_s: float = CHECK_IDLE_S,
        unreachable_wait_s: float | None = None,
        configure: Callable[[psycopg.AsyncConnection[TupleRow]], Awaitable[None]],
        **kwargs: Any,
    ) -> None:
        self.check_idle_s = check_idle_s
        self.unreachable_wait_s = unreachable_wait_s
        # When an attempt to connect last failed, with none succeeded since (None: reachable).
        self.unreachable_since: float | None = None
        self._returned_at: weakref.WeakKeyDictionary[psycopg.AsyncConnection[TupleRow], float] = (
            weakref.WeakKeyDictionary()
        )

        async def made(conn: psycopg.AsyncConnection[TupleRow]) -> None:
            await configure(conn)
            self._returned_at[conn] = time.monotonic()

        super().__init__(*args, check=self._check_if_idle, configure=made, **kwargs)
        self._sweep: asyncio.Task[None] | None = None

    async def _add_connection(
        self, attempt: AttemptWithBackoff | None, growing: bool = False
    ) -> None:
        # psycopg_pool makes the first attempt's backoff here; every retry carries it on.
        token = _growing.set(growing)
        try:
            await super()._add_connection(
                attempt or CappedBackoff(timeout=self.reconnect_timeout), growing
            )
        finally:
            _growing.reset(token)

    async def _connect(self, timeout: float | None = None) -> psycopg.AsyncConnection[TupleRow]:
        try:
            conn = await super()._connect(timeout)
        except Exception as exc:
            if _growing.get():  # one more refused: the others work (`_growing`)
                raise
            metrics.DEPENDENCY_REACHABLE.labels("database").set(0)
            if self.unreachable_since is None:
                self.unreachable_since = time.monotonic()
                log.warning(
                    "the database cannot be reached: %s",
                    exc,
                    extra={"event": "store.unreachable", "error": str(exc)},
                )
            if self.unreachable_wait_s is not None:
                await self._fail_waiting(exc)
            raise
        metrics.DEPENDENCY_REACHABLE.labels("database").set(1)
        if self.unreachable_since is not None:
            down = time.monotonic() - self.unreachable_since
            self.unreachable_since = None
            log.info(
                "the database is reached again after %.1f s",
                down,
                extra={"event": "store.reachable", "unreachable_s": round(down, 3)},
            )
        return conn

    async def _fail_waiting(self, error: Exception) -> None:
        """Tell every checkout waiting for a connection now that it gets none (as psycopg_pool's
        close tells them the pool closed): an `OperationalError` naming why, the store's
        transient error (psycopg_pool's getconn words a `PoolTimeout` again as its whole wait)."""
        async with self._lock:
            waiting = list(self._waiting)
            self._waiting.clear()
        for position in waiting:
            await position.fail(
                psycopg.OperationalError(f"the database cannot be reached: {error}")
            )

    async def getconn(self, timeout: float | None = None) -> psycopg.AsyncConnection[TupleRow]:
        if self.unreachable_wait_s is not None and self.unreachable_since is not None:
            wait = self.timeout if timeout is None else timeout
            timeout = min(wait, self.unreachable_wait_s)
        return await super().getconn(timeout)

    async def putconn(self, conn: psycopg.AsyncConnection[TupleRow]) -> None:
        self._returned_at[conn] = time.monotonic()
        await super().putconn(conn)

    async def _check_if_idle(self, conn: psycopg.AsyncConnection[TupleRow]) -> None:
        returned = self._returned_at.get(conn)
        if returned is None or time.monotonic() - returned >= self.check_idle_s:
            reason = "idle"
        elif has_input(conn):
            reason = "input"
        else:
            return
        try:
            await AsyncConnectionPool.check_connection(conn)
        except Exception as exc:  # the pool discards it and hands out another
            metrics.DB_CONNECTIONS_REPLACED.labels(reason).inc()
            log.warning(
                "a pooled connection failed its check and is replaced",
                extra={"event": "store.connection_replaced", "reason": reason, "error": str(exc)},
            )
            self._check_the_others()
            raise

    def _check_the_others(self) -> None:
        """Check every idle connection now, in the background (psycopg_pool's `check`: each
        broken one is replaced): the checkout that found a dead one then finds a live one after
        the pool's first backoff (about 1 s) instead of one backoff per dead connection (1, 2,
        4, 8 s: past the 10 s pool timeout with five of them)."""
        if self._sweep is None or self._sweep.done():
            self._sweep = asyncio.create_task(self.check(), name="pool-check")
            self._sweep.add_done_callback(_swept)

    async def close(self, timeout: float = 5.0) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
        await super().close(timeout)


class CappedBackoff(AttemptWithBackoff):
    """psycopg_pool's reconnect backoff, at most RECONNECT_MAX_DELAY_S between attempts."""

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        self.delay = min(self.delay, RECONNECT_MAX_DELAY_S)


def _swept(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning(
            "checking the pool's idle connections failed",
            extra={"event": "store.pool_check_failed", "error": str(exc)},
        )
