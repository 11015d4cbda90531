"""OpenTelemetry tracing: one trace from the enqueue request to the settlement.

A tracer provider is always installed so trace ids exist and are recorded on `job.enqueued`;
spans are exported over OTLP/HTTP only when `OTEL_EXPORTER_OTLP_ENDPOINT` is set. Temporal's
tracing interceptor carries the context through the driver and attempt workflows into the
activities, and the psycopg instrumentation adds a span per SQL statement.

While nothing consumes spans (no OTLP endpoint, no processor attached) spans are not recorded
and psycopg is not instrumented: trace ids are still generated and propagated, but the 5–6
spans per request that nobody would read cost the api a third of its throughput in `make bench`.
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry import context, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger("roles.infra.tracing")

_configured = False
_propagator = TraceContextTextMapPropagator()


class _RecordWhenConsumed(Sampler):
    """Record every span once something consumes them; until then drop them (a dropped span
    still carries a fresh trace id, so `job.enqueued` records one either way)."""

    def __init__(self) -> None:
        self.recording = False

    def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
        if self.recording:
            return SamplingResult(Decision.RECORD_AND_SAMPLE)
        return SamplingResult(Decision.DROP)

    def get_description(self) -> str:
        return "RecordWhenConsumed"


_sampler = _RecordWhenConsumed()


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


def recording() -> bool:
    """Whether spans are recorded (an exporter or processor is attached)."""
    return _sampler.recording


def _consume(provider: TracerProvider, processor: SpanProcessor) -> None:
    provider.add_span_processor(processor)
    if not _sampler.recording:
        _sampler.recording = True
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

        PsycopgInstrumentor().instrument(tracer_provider=provider)


def current_traceparent() -> str | None:
    """The W3C `traceparent` of the current span, or None outside a recording span."""
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


def trace_id_of(traceparent: str | None) -> str | None:
    """The 32-hex trace id inside a `traceparent`."""
    if not traceparent:
        return None
    parts = traceparent.split("-")
    return parts[1] if len(parts) == 4 else None
