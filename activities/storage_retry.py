"""The storage retry around every settlement: 5 attempts, 150 ms × attempt, transient errors only."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from receipts import metrics
from receipts.errors import TransientStorageError

log = logging.getLogger("activities.storage_retry")

T = TypeVar("T")

STORAGE_ATTEMPTS = 5
STORAGE_BACKOFF_S = 0.150


async def with_storage_retry(
    operation: Callable[[], Awaitable[T]],
    *,
    attempts: int = STORAGE_ATTEMPTS,
    backoff_s: float = STORAGE_BACKOFF_S,
    what: str = "storage operation",
) -> T:
    """Run `operation`, retrying only `TransientStorageError`, sleeping `backoff_s × attempt`.

    A constraint violation or any other error is not transient and propagates at once. A
    retried settle is safe: its settlement id makes an ambiguous earlier commit report success.
    """
    for attempt in range(1, attempts + 1):
        try:
            return await operation()
        except TransientStorageError as exc:
            if attempt == attempts:
                raise
            metrics.STORAGE_RETRIES.inc()
            log.warning(
                "transient storage error; retrying",
                extra={
                    "event": "storage.retry",
                    "what": what,
                    "attempt": attempt,
                    "error": str(exc),
                },
            )
            await asyncio.sleep(backoff_s * attempt)
    raise AssertionError("unreachable")
