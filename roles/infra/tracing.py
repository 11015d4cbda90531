"""OpenTelemetry tracing: one trace per job, from the caller's `traceparent` to the callback.

A tracer provider is always installed so trace ids exist and are recorded on `job.enqueued`;
spans are exported over OTLP/HTTP only when `OTEL_EXPORTER_OTLP_ENDPOINT` is set. The api's
enqueue span is the child of the caller's `traceparent` (`caller_context`); Temporal's tracing
interceptor carries the context through the driver and attempt workflows into the activities,
and where it does not (a loop, spans not recorded) the job's stored `traceparent` is attached
(receipts/trace_context.py); the psycopg instrumentation adds a span per SQL statement run
inside another span (a loop's polls outside any are no trace). A role flushes the spans it holds
when it exits (`flush_spans`).

While nothing consumes spans (no OTLP endpoint, no processor attached) spans are not recorded
and psycopg is not instrumented: trace ids are still generated and propagated, but the 5–6
spans per request that nobody would read cost the api a third of its throughput in `make bench`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from opentelemetry import context, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes

# A job's trace context, used below the roles too (activities: the attempt, the callbacks).
from receipts.trace_context import (
    attach_traceparent,
    current_traceparent,
    detach,
    job_trace,
    trace_id_of,
)

__all__ = [
    "attach_traceparent",
    "caller_context",
    "caller_span",
    "configure_tracing",
    "current_traceparent",
    "detach",
    "flush_spans",
    "job_trace",
    "recording",
    "trace_id_of",
]

log = logging.getLogger("roles.infra.tracing")

_configured = False
_propagator = TraceContextTextMapPropagator()


class _RecordWhenConsumed(Sampler):
    """Record every span once something consumes them, but none below a parent not sampled;
    until then drop them (a dropped span still carries a fresh trace id, so `job.enqueued`
    records one either way)."""

    def __init__(self) -> None:
        self.recording = False

    def should_sample(
        self,
        parent_context: context.Context | None,
        trace_id: int,
        name: str,
        kind: trace.SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[trace.Link] | None = None,
        trace_state: trace.TraceState | None = None,
    ) -> SamplingResult:
        parent = trace.get_current_span(parent_context).get_span_context()
        # A parent not sampled (a caller's `traceparent` with sampled=0, and the spans below
        # it) keeps its trace unrecorded, as W3C and OpenTelemetry's parent-based sampler say.
        if not self.recording or (parent.is_valid and not parent.trace_flags.sampled):
            return SamplingResult(Decision.DROP)
        # A recorded span starts with the attributes the sampler hands back (the SDK takes
        # them from here, not from the call): the span's own, and its parent's trace state.
        return SamplingResult(
            Decision.RECORD_AND_SAMPLE, attributes, parent.trace_state if parent.is_valid else None
        )

    def get_description(self) -> str:
        return "RecordWhenConsumed"


_sampler = _RecordWhenConsumed()


class _UnderASpan(Sampler):
    """The SQL statements' spans: recorded as `_sampler` says inside a span (a job's step, a
    request, a batch), never as a trace of their own: a background loop's polls (the webhook
    claim, the recovery scans, the bookkeeping) made one single-span trace each, ~550 a minute
    from idle roles."""

    def should_sample(
        self,
        parent_context: context.Context | None,
        trace_id: int,
        name: str,
        kind: trace.SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[trace.Link] | None = None,
        trace_state: trace.TraceState | None = None,
    ) -> SamplingResult:
        if not trace.get_current_span(parent_context).get_span_context().is_valid:
            return SamplingResult(Decision.DROP)
        return _sampler.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return "UnderASpan"


# The psycopg instrumentation's own provider (made with the first consumer): the process's
# resource and processors, the sampler above.
_sql_provider: TracerProvider | None = None


def configure_tracing(
    service: str, *, otlp: bool = False, processor: SpanProcessor | None = None
) -> TracerProvider:
    """Install the process's tracer provider (once); record spans and instrument psycopg
    once something consumes them.

    `processor` lets a test attach an in-memory exporter; otherwise spans go to OTLP when `otlp`
    (OTEL_EXPORTER_OTLP_ENDPOINT is set: the exporter reads the OTEL_* variables itself), and
    are not recorded when it is not.
    """
    global _configured
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider(
            resource=Resource.create({"service.name": service}), sampler=_sampler
        )
        trace.set_tracer_provider(provider)
    if not _configured:
        _configured = True
        if otlp:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            _consume(provider, BatchSpanProcessor(OTLPSpanExporter()))
            log.info("exporting traces over OTLP", extra={"event": "tracing.otlp"})
    if processor is not None:
        _consume(provider, processor)
    return provider


def flush_spans(timeout_s: float = 5.0) -> None:
    """Export the spans the batch processor still holds (at a role's exit), for at most
    `timeout_s`; a stalled collector costs the exit that long, never more."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider) and _sampler.recording:
        provider.force_flush(timeout_millis=int(timeout_s * 1000))


def recording() -> bool:
    """Whether spans are recorded (an exporter or processor is attached)."""
    return _sampler.recording


def _consume(provider: TracerProvider, processor: SpanProcessor) -> None:
    global _sql_provider
    provider.add_span_processor(processor)
    if _sql_provider is None:
        _sql_provider = TracerProvider(
            resource=provider.resource, sampler=_UnderASpan(), shutdown_on_exit=False
        )
    _sql_provider.add_span_processor(processor)
    if not _sampler.recording:
        _sampler.recording = True
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

        PsycopgInstrumentor().instrument(tracer_provider=_sql_provider)


def caller_context(headers: Mapping[str, str]) -> context.Context:
    """The parent of a request's spans: the current context when a span is already current (the
    framework's request span, itself the child of the caller's `traceparent`), else the
    caller's `traceparent` header (a malformed one is ignored: a new trace starts), so a job
    joins its caller's trace whether or not spans are recorded."""
    if trace.get_current_span().get_span_context().is_valid:
        return context.get_current()
    traceparent = headers.get("traceparent")
    return _propagator.extract({"traceparent": traceparent} if traceparent else {})


@contextmanager
def caller_span(name: str, headers: Mapping[str, str], **attributes: str) -> Iterator[str | None]:
    """A span of the api in the caller's trace (`caller_context`); yields its `traceparent`,
    what a job, objective or agent job created under it records as its trace."""
    tracer = trace.get_tracer("receipt.api")
    with tracer.start_as_current_span(name, context=caller_context(headers), attributes=attributes):
        yield current_traceparent()
