"""A turn's grant at the AI gateway (`activities/gateway.py`): what it may call, what its calls
cost and met, and the calls it has in flight."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from opentelemetry import trace

from activities.gateway_pool import Slots
from activities.gateway_usage import Usage
from receipts import metrics

log = logging.getLogger("activities.gateway")
_tracer = trace.get_tracer("receipt.gateway")

BUDGET_QUOTA = "(the organization's daily token budget)"
"""The quota key a spent budget is recorded under (the models' own are their names): every
model's calls are refused until it renews (activities/gateway_budget.py)."""

MAX_GRANT_BODY_BYTES = 64 * 1024 * 1024
"""The bodies of a turn's calls in flight, together (each at most 32 MiB, 8 in flight): a
worker runs several turns, and each body is held until its answer is sent."""


class Meter(Protocol):
    """What a grant counts its calls into (`activities/gateway_budget.py` `Meter`)."""

    def count(self, organization_id: str | None, usage: Usage) -> None: ...


@dataclass
class Grant:
    """What one turn may call, and what its calls cost and met."""

    token: str
    job_id: str
    attempt: int
    agent_id: str
    organization_id: str | None
    binding: str
    meter: Meter | None = None  # of its organization's daily token budget
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    dead_pool: str | None = None
    in_flight: int = 0
    socket: Path | None = None  # the turn's own way in (`Gateway.grant`)
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # set while nothing is in flight
    body_bytes: int = 0  # of the bodies of its calls in flight, held until each answer is sent
    # The quota met per model: a call served on one model does not clear the quota another met
    # (a client that uses two models met it on its main one).
    quota_models: dict[str, datetime] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.idle.set()

    def take_body(self, size: int) -> bool:
        """Hold `size` more bytes of the turn's bodies in flight, unless that passes
        MAX_GRANT_BODY_BYTES."""
        if self.body_bytes + size > MAX_GRANT_BODY_BYTES:
            return False
        self.body_bytes += size
        return True

    def call_began(self) -> None:
        self.in_flight += 1
        self.idle.clear()

    def call_ended(self) -> None:
        self.in_flight -= 1
        if self.in_flight <= 0:
            self.idle.set()

    def ended_on(self, slots: Slots) -> None:
        """A relayed call's answer sent: the credential's slot it held and the call end."""
        slots.release(self.organization_id or "")
        self.call_ended()

    def give_back(self, release: Callable[[], None], body_bytes: int) -> None:
        """A relayed call's answer sent: its body's bytes given back, then `release`."""
        self.body_bytes -= body_bytes
        release()

    def count(self, status: str, usage: Usage, duration_s: float = 0.0) -> None:
        """A call's answer ended (`status`: its HTTP status, or why it has none): its tokens are
        the turn's, its organization's (the meter) and the metrics'."""
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        if self.meter is not None:
            self.meter.count(self.organization_id, usage)
        agent = metrics.agent_label(self.agent_id)
        metrics.GATEWAY_CALLS.labels(self.binding, agent, status).inc()
        metrics.GATEWAY_TOKENS.labels(self.binding, agent, "in").inc(usage.input_tokens)
        metrics.GATEWAY_TOKENS.labels(self.binding, agent, "out").inc(usage.output_tokens)
        log.info(
            "model call",
            extra={"event": "gateway.call", "binding": self.binding, "jobId": self.job_id,
                   "status": status, "inputTokens": usage.input_tokens,
                   "outputTokens": usage.output_tokens, "durationS": round(duration_s, 3)},
        )  # fmt: skip
        # A span of the turn's attempt (the grant's server runs in its context) as long as the
        # call, its answer's end included (a stream's), written once its usage is known.
        ended = time.time_ns()
        span = _tracer.start_span(
            "receipt.gateway.call",
            kind=trace.SpanKind.CLIENT,
            start_time=ended - int(duration_s * 1e9),
            attributes={
                "receipt.job_id": self.job_id,
                "receipt.gateway.binding": self.binding,
                "receipt.gateway.status": status,
                "receipt.gateway.input_tokens": usage.input_tokens,
                "receipt.gateway.output_tokens": usage.output_tokens,
            },
        )
        if not (status.isdigit() and int(status) < 400):
            span.set_status(trace.StatusCode.ERROR, f"model call: {status}")
        span.end(end_time=ended)

    def met_quota(self, model: str, until: datetime) -> None:
        self.quota_models[model] = max(self.quota_models.get(model, until), until)

    def served(self, model: str) -> None:
        """A call on `model` was answered: the quota it met, if any, has passed."""
        self.quota_models.pop(model, None)

    @property
    def quota_until(self) -> datetime | None:
        """The earliest recovery of the quota the turn still meets (None: none), but not
        before its organization's budget renews if the turn met it: that holds every model."""
        earliest = min(self.quota_models.values(), default=None)
        budget = self.quota_models.get(BUDGET_QUOTA)
        return max(earliest, budget) if earliest is not None and budget is not None else earliest

    def summary(self) -> dict[str, Any]:
        """The turn's usage as its result carries it (an `agent_job.usage` receipt)."""
        return {
            "binding": self.binding,
            "calls": self.calls,
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
        }
