"""Per-organization enqueue limits of one api process: a token bucket per organization.

The caps on queued and active jobs are read from the database at each enqueue (they hold across
api processes); the rate is per process (an api behind N replicas admits up to N times it).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from prometheus_client import Counter as PromCounter
from prometheus_client import Gauge

log = logging.getLogger("roles.api.app")

LIMITED = PromCounter(
    "receipt_api_limited",
    "Requests the api refused at one of its limits (README, Security), by limit.",
    ["limit"],
)
"""Label values: rate, queued, active, streams_token, streams_total, commands, command_bytes,
body_shape."""
EVENT_STREAMS = Gauge("receipt_api_event_streams", "Event streams the api serves now.")

MAX_BUCKETS = 10_000
"""Buckets kept at most; a full table drops the fullest (idle) ones first."""


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


class OrgLimits:
    """`take(org)` admits one enqueue or returns the seconds until one would be admitted."""

    def __init__(self, rate_per_s: float, burst: int) -> None:
        self.rate = rate_per_s
        self.burst = float(burst)
        self._buckets: dict[str, _Bucket] = {}

    def take(self, organization: str) -> float:
        """Admit one enqueue for `organization` (0.0) or return the wait in seconds (> 0)."""
        now = time.monotonic()
        bucket = self._buckets.get(organization)
        if bucket is None:
            if len(self._buckets) >= MAX_BUCKETS:
                self._forget_full(now)
            bucket = self._buckets[organization] = _Bucket(self.burst, now)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.rate)
        bucket.at = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self.rate

    def _forget_full(self, now: float) -> None:
        for name, bucket in list(self._buckets.items()):
            if bucket.tokens + (now - bucket.at) * self.rate >= self.burst:
                del self._buckets[name]
        if len(self._buckets) >= MAX_BUCKETS:
            self._buckets.clear()
