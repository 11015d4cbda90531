"""Refusals logged at most once per interval per kind and caller: a flood of refused requests
is counted in full by its metric but must not become a flood of log lines (the api's limits,
the AI gateway's refusals, the dispatches held at an organization's share)."""

from __future__ import annotations

import time

REFUSAL_LOG_INTERVAL_S = 10.0
"""A refusal of the same kind to the same caller is logged at most once per this interval."""
MAX_KEYS = 10_000
"""(kind, caller) pairs remembered at most; past that the table starts again."""


class RefusalLog:
    """`due(kind, who)`: None while a refusal of `kind` to `who` was logged in the last
    REFUSAL_LOG_INTERVAL_S, else how many were refused unlogged since (0 the first time)."""

    def __init__(self, interval_s: float = REFUSAL_LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._last: dict[tuple[str, str], tuple[float, int]] = {}

    def due(self, kind: str, who: str) -> int | None:
        now = time.monotonic()
        key = (kind, who)
        logged_at, unlogged = self._last.get(key, (float("-inf"), 0))
        if now - logged_at < self.interval_s:
            self._last[key] = (logged_at, unlogged + 1)
            return None
        if len(self._last) >= MAX_KEYS:
            self._last.clear()
        self._last[key] = (now, 0)
        return unlogged
