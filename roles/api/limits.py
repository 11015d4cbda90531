"""The limits of one api process: a token bucket per organization for enqueues, and the caps
on open event streams (overall and per token).

The caps on queued and active jobs are read from the database at each enqueue (they hold across
api processes); the rate and the stream caps are per process (an api behind N replicas admits up
to N times them).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass

from receipts import metrics
from receipts.refusal_log import RefusalLog
from roles.api.errors import ApiError, too_many

log = logging.getLogger("roles.api.app")


SSE_RETRY_MS = 1000
"""How long an event stream's client waits before it reconnects (the `retry:` of the stream)."""
MAX_BUCKETS = 10_000
"""Buckets kept at most; a full table drops the fullest (idle) ones first."""

refusals = RefusalLog()
"""The api process's refusal log: one per process, as the limits are."""


ADMIN_BUCKET = "*admin"
"""The rate bucket (and refusal-log key) of work no organization owns: an admin token's."""
# Console sessions one token may make: 10 at once, then one every 6 s, per api process. Each
# sign-in is a stored session that lives until it idles out (30 min): unbounded, one token made
# 519 a second, as many rows (README, "Operator console").
SESSIONS_PER_S = 1 / 6
SESSIONS_BURST = 10
CALLER = "caller"
"""The request state's key of the principal the request was authenticated as (set by
`deps.request_caller` and the enqueue gate): whose bodies in flight its body counts in."""


def _rate_refused(organization_id: str | None, wait_s: float) -> ApiError:
    """The 429 of work over its organization's enqueue rate (`wait_s` until a token): counted
    every time, logged once per REFUSAL_LOG_INTERVAL_S per organization."""
    metrics.API_LIMITED.labels("rate").inc()
    if (unlogged := refusals.due("rate", organization_id or ADMIN_BUCKET)) is not None:
        log.warning(
            "enqueue rate limited",
            extra={
                "event": "api.rate_limited",
                "organizationId": organization_id,
                "unloggedSince": unlogged,
            },
        )
    return too_many(
        "the organization's enqueue rate is exceeded (RECEIPT_ORG_ENQUEUE_RATE)", wait_s
    )


def command_cap_refused(organization_id: str | None, job_id: str) -> None:
    """A command refused at its job's cap (RECEIPT_MAX_COMMANDS_PER_JOB): counted every time,
    logged once per REFUSAL_LOG_INTERVAL_S per organization, as the other limits are."""
    metrics.API_LIMITED.labels("commands").inc()
    if (unlogged := refusals.due("commands", organization_id or ADMIN_BUCKET)) is not None:
        log.warning(
            "command refused: the job holds its cap of commands",
            extra={"event": "api.command_cap", "jobId": job_id, "unloggedSince": unlogged},
        )


def follow_up_cap_refused(organization_id: str | None, job_id: str) -> None:
    """A follow-up refused at its agent job's cap (RECEIPT_AGENT_JOB_MAX_FOLLOW_UP_BYTES):
    counted every time, logged once per REFUSAL_LOG_INTERVAL_S per organization."""
    metrics.API_LIMITED.labels("follow_up_bytes").inc()
    if (unlogged := refusals.due("follow_up_bytes", organization_id or ADMIN_BUCKET)) is not None:
        log.warning(
            "follow-up refused: its agent job holds its cap of follow-ups",
            extra={"event": "api.follow_up_cap", "jobId": job_id, "unloggedSince": unlogged},
        )


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


class OrgLimits:
    """`admit(organization_id)` takes one of the organization's enqueue tokens or raises the
    429 (`take` returns the seconds until one would be admitted instead); `admit_paced` holds
    the 429 first.

    Why hold a refusal: a client that posts again as soon as it is refused (a flood, or a
    retry loop that ignores `Retry-After`) is answered hundreds of times a second per
    connection, each answer a request cycle of the one api process, on the event loop every
    other organization's posts share (`make chaos`'s hostile tenant: 55 000 refusals in 120 s
    put another organization's enqueue p99 at 2–3.7x its quiet value). Held until the
    organization's next token is due, a connection is refused at most about as often as its
    organization is admitted; a held refusal costs a timer, not CPU.
    """

    def __init__(
        self, rate_per_s: float, burst: int, hold_s: float = 0.0, max_held: int = 0
    ) -> None:
        self.rate = rate_per_s
        self.burst = float(burst)
        self.hold_s = hold_s
        self.max_held = max_held
        self.held = 0
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

    def wait(self, key: str) -> float:
        """The seconds until `key` would be admitted (0.0: now), taking nothing."""
        bucket = self._buckets.get(key)
        if bucket is None:
            return 0.0
        tokens = min(self.burst, bucket.tokens + (time.monotonic() - bucket.at) * self.rate)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate

    def admit(self, organization_id: str | None) -> None:
        """Take one enqueue token of `organization_id` (None: an admin's work), or raise the
        rate's 429, counted and logged (`_rate_refused`)."""
        wait_s = self.take(organization_id or ADMIN_BUCKET)
        if wait_s > 0:
            raise _rate_refused(organization_id, wait_s)

    async def admit_paced(self, organization_id: str | None) -> None:
        """`admit`, but a refusal is held until the organization's next token is due (at most
        `hold_s`) before it is raised, while fewer than `max_held` refusals are held by this
        process (past that, a refusal is raised at once: held refusals are bounded)."""
        wait_s = self.take(organization_id or ADMIN_BUCKET)
        if wait_s <= 0:
            return
        hold_s = min(wait_s, self.hold_s)
        if hold_s > 0 and self.held < self.max_held:
            self.held += 1
            metrics.API_REFUSALS_HELD.inc()
            try:
                await asyncio.sleep(hold_s)
            finally:
                self.held -= 1
                metrics.API_REFUSALS_HELD.dec()
            wait_s -= hold_s
        raise _rate_refused(organization_id, wait_s)

    def _forget_full(self, now: float) -> None:
        for name, bucket in list(self._buckets.items()):
            if bucket.tokens + (now - bucket.at) * self.rate >= self.burst:
                del self._buckets[name]
        if len(self._buckets) >= MAX_BUCKETS:
            self._buckets.clear()


class StreamGate:
    """Counts open event streams, overall and per token; refuses one more with 429."""

    def __init__(self, overall: int, per_token: int) -> None:
        self.overall = overall
        self.per_token = per_token
        self.open: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self.open.values())

    def acquire(self, token_id: str) -> StreamSlot:
        """Take one slot for `token_id`, or raise 429; the slot is given back by `release`."""
        if self.open[token_id] >= self.per_token:
            metrics.API_LIMITED.labels("streams_token").inc()
            if (unlogged := refusals.due("streams_token", token_id)) is not None:
                log.warning(
                    "event stream refused: the token's cap",
                    extra={
                        "event": "api.sse_refused",
                        "cap": "token",
                        "tokenId": token_id,
                        "unloggedSince": unlogged,
                    },
                )
            raise too_many(
                f"this token already has {self.per_token} open event streams "
                "(RECEIPT_SSE_MAX_STREAMS_PER_CALLER)",
                SSE_RETRY_MS / 1000,
            )
        if self.total >= self.overall:
            metrics.API_LIMITED.labels("streams_total").inc()
            if (unlogged := refusals.due("streams_total", "")) is not None:
                log.warning(
                    "event stream refused: the api's cap",
                    extra={
                        "event": "api.sse_refused",
                        "cap": "total",
                        "tokenId": token_id,
                        "unloggedSince": unlogged,
                    },
                )
            raise too_many(
                f"the API already serves {self.overall} event streams (RECEIPT_SSE_MAX_STREAMS)",
                SSE_RETRY_MS / 1000,
            )
        self.open[token_id] += 1
        metrics.API_EVENT_STREAMS.inc()
        return StreamSlot(self, token_id)

    def _release(self, token_id: str) -> None:
        metrics.API_EVENT_STREAMS.dec()
        self.open[token_id] -= 1
        if self.open[token_id] <= 0:
            del self.open[token_id]


class StreamSlot:
    """One open stream's place in the gate; `release` is idempotent."""

    def __init__(self, gate: StreamGate, token_id: str) -> None:
        self._gate: StreamGate | None = gate
        self.token_id = token_id

    def release(self) -> None:
        if self._gate is not None:
            gate, self._gate = self._gate, None
            gate._release(self.token_id)

    def held_by(self, stream: AsyncIterator[str]) -> AsyncIterator[str]:
        """`stream`, giving the slot back when it ends or is closed, and also when it is
        dropped without ever being started (a client gone before the response began)."""

        async def gated() -> AsyncIterator[str]:
            try:
                async for event in stream:
                    yield event
            finally:
                self.release()

        iterator = gated()
        weakref.finalize(iterator, self.release)
        return iterator


class BodyBytes:
    """The bytes of request bodies being read now, per organization; past `per_org` a body is
    refused (429), counted and logged. A body that stops short of its end holds what it sent
    for as long as its client keeps the connection: unbounded, one organization's connections
    held as much of the api's memory as it opened them (300 command bodies stalled 1 KiB short
    of 1 MiB: +311 MB, held until they closed)."""

    def __init__(self, per_org: int) -> None:
        self.per_org = per_org
        self.held: Counter[str] = Counter()

    def take(self, key: str, size: int) -> None:
        """Count `size` more bytes of `key`'s bodies, or raise the 429 past `per_org`."""
        if self.held[key] + size > self.per_org:
            metrics.API_LIMITED.labels("body_bytes").inc()
            if (unlogged := refusals.due("body_bytes", key)) is not None:
                log.warning(
                    "request body refused: the organization's bodies being read",
                    extra={
                        "event": "api.body_bytes_limited",
                        "organizationId": key,
                        "unloggedSince": unlogged,
                    },
                )
            raise too_many(
                f"the organization's request bodies being read already hold {self.per_org} "
                "bytes (RECEIPT_ORG_BODY_BYTES_IN_FLIGHT)",
                SSE_RETRY_MS / 1000,
            )
        self.held[key] += size

    def give(self, key: str, size: int) -> None:
        """Give back `size` bytes of `key`'s (a body read, or refused)."""
        self.held[key] -= size
        if self.held[key] <= 0:
            del self.held[key]


class InFlight:
    """Requests being worked on, per organization (or console session); past `per_org`, refused."""

    def __init__(self, per_org: int) -> None:
        self.per_org = per_org
        self.held: Counter[str] = Counter()

    def take(self, key: str) -> bool:
        """Count one more request of `key`; False (nothing counted) when it holds `per_org`."""
        if self.held[key] >= self.per_org:
            return False
        self.held[key] += 1
        return True

    def give(self, key: str) -> None:
        self.held[key] -= 1
        if self.held[key] <= 0:
            del self.held[key]
