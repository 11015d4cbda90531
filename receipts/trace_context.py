"""A job's W3C trace context: read the current one, attach a stored one, name its trace id.

The api records the `traceparent` of its enqueue span on `job.enqueued` (the caller's trace,
roles/infra/tracing.py); every later step of the job (the dispatch, the attempt, the settle, the
callback) runs in that trace, carried by Temporal's interceptor while spans are recorded and
attached from the job otherwise, so its spans and its log lines (roles/infra/logs.py) name it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import context, trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_propagator = TraceContextTextMapPropagator()


def current_traceparent() -> str | None:
    """The W3C `traceparent` of the current span, or None outside a span."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


def attach_traceparent(traceparent: str | None) -> object | None:
    """Make `traceparent` the current context (returns a token for `detach`), or do nothing."""
    if not traceparent:
        return None
    return context.attach(_propagator.extract({"traceparent": traceparent}))


def detach(token: object | None) -> None:
    """Undo `attach_traceparent`."""
    if token is not None:
        context.detach(token)  # type: ignore[arg-type]


def links_to(traceparent: str | None) -> list[trace.Link]:
    """A link to the span a stored `traceparent` names (an earlier trace this work follows
    from), or none."""
    if not traceparent:
        return []
    linked = trace.get_current_span(_propagator.extract({"traceparent": traceparent}))
    context_of = linked.get_span_context()
    return [trace.Link(context_of)] if context_of.is_valid else []


def trace_id_of(traceparent: str | None) -> str | None:
    """The 32-hex trace id inside a `traceparent` (`00-<trace id>-<span id>-<flags>`)."""
    parts = (traceparent or "").split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else None


@contextmanager
def job_trace(traceparent: str | None) -> Iterator[None]:
    """Run the block in a job's trace: as it is when the current span is of that trace already
    (Temporal's interceptor carried it into an activity), else under the job's stored
    `traceparent` (a loop, or spans not recorded: no interceptor)."""
    current = trace.get_current_span().get_span_context()
    if not traceparent or (
        current.is_valid and f"{current.trace_id:032x}" == trace_id_of(traceparent)
    ):
        yield
        return
    token = attach_traceparent(traceparent)
    try:
        yield
    finally:
        detach(token)
