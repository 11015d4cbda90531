"""Spans are not recorded until something consumes them, yet trace ids still propagate."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from roles.infra.tracing import (
    _RecordWhenConsumed,
    attach_traceparent,
    current_traceparent,
    detach,
    trace_id_of,
)


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


def test_a_callers_unsampled_traceparent_is_honoured() -> None:
    # W3C `sampled=0`: the caller decided this trace is not recorded; the roles' spans in it are
    # not either (nor exported), and what they pass on (a callback's traceparent) says so.
    sampler = _RecordWhenConsumed()
    sampler.recording = True
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    traced = {}
    for flags in ("00", "01"):
        trace_id = f"{int(flags) + 1:032x}"
        token = attach_traceparent(f"00-{trace_id}-{'1' * 16}-{flags}")
        try:
            with tracer.start_as_current_span("enqueue"), tracer.start_as_current_span("sql"):
                traced[flags] = current_traceparent()
        finally:
            detach(token)
    assert [s.name for s in exporter.get_finished_spans()] == ["sql", "enqueue"]
    assert {f"{s.context.trace_id:032x}" for s in exporter.get_finished_spans()} == {f"{2:032x}"}
    assert str(traced["00"]).endswith("-00") and str(traced["01"]).endswith("-01")
