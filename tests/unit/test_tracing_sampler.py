"""Spans are not recorded until something consumes them, yet trace ids still propagate."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from roles.infra.tracing import _RecordWhenConsumed, current_traceparent, trace_id_of


def test_unconsumed_spans_are_not_recorded_but_carry_a_trace_id() -> None:
    sampler = _RecordWhenConsumed()
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")

    with tracer.start_as_current_span("dropped") as span:
        assert not span.is_recording()
        traceparent = current_traceparent()
    assert traceparent is not None
    trace_id = trace_id_of(traceparent)
    assert trace_id is not None and trace_id != "0" * 32
    assert trace_id == f"{span.get_span_context().trace_id:032x}"

    sampler.recording = True
    with tracer.start_as_current_span("kept", attributes={"receipt.job_id": "job-1"}) as span:
        assert span.is_recording()
    assert [s.name for s in exporter.get_finished_spans()] == ["kept"]
    # A recorded span keeps the attributes it was started with (the sampler hands them back).
    assert dict(exporter.get_finished_spans()[0].attributes or {}) == {"receipt.job_id": "job-1"}
    assert trace.get_current_span() is trace.INVALID_SPAN
