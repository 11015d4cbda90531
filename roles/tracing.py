"""OpenTelemetry tracing: one trace from the enqueue request to the settlement.

A tracer provider is always installed so trace ids exist and are recorded on `job.enqueued`;
spans are exported over OTLP/HTTP only when `OTEL_EXPORTER_OTLP_ENDPOINT` is set. Temporal's
tracing interceptor carries the context through the driver and attempt workflows into the
activities, and the psycopg instrumentation adds a span per SQL statement.
"""

from __future__ import annotations

import logging
import os

from opentelemetry import context, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger("roles.tracing")

_configured = False
_propagator = TraceContextTextMapPropagator()


def configure_tracing(service: str, processor: SpanProcessor | None = None) -> TracerProvider:
    """Install the process's tracer provider (once) and instrument psycopg.

    `processor` lets a test attach an in-memory exporter; otherwise spans go to OTLP when the
    endpoint is configured, and nowhere when it is not.
    """
    global _configured
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        trace.set_tracer_provider(provider)
    if processor is not None:
        provider.add_span_processor(processor)
    if not _configured:
        _configured = True
        if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            log.info("exporting traces over OTLP", extra={"event": "tracing.otlp"})
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

        PsycopgInstrumentor().instrument(tracer_provider=provider)
    return provider


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
