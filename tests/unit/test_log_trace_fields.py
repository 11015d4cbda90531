"""A JSON log line names the current span's trace and span; a job's stored traceparent is its
trace when no span of it is current (a loop, or spans not recorded)."""

from __future__ import annotations

import json
import logging

from opentelemetry.sdk.trace import TracerProvider

from receipts.trace_context import job_trace
from roles.infra.logs import JsonFormatter
from roles.infra.tracing import _RecordWhenConsumed

TRACE_ID, SPAN_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{SPAN_ID}-01"


def line(message: str = "m", **extra: object) -> dict[str, object]:
    record = logging.LogRecord("t", logging.INFO, __file__, 1, message, None, None)
    record.__dict__.update(extra)
    parsed: dict[str, object] = json.loads(JsonFormatter("worker").format(record))
    return parsed


def test_a_line_outside_a_span_carries_no_trace_fields() -> None:
    assert "trace_id" not in line() and "span_id" not in line()


def test_a_line_in_a_jobs_trace_names_it_recorded_or_not() -> None:
    with job_trace(TRACEPARENT):
        attached = line(event="attempt.started")
    assert attached["trace_id"] == TRACE_ID and attached["span_id"] == SPAN_ID
    # A span started in the job's trace, not recorded (no exporter): its own id, same trace.
    tracer = TracerProvider(sampler=_RecordWhenConsumed()).get_tracer("t")
    with job_trace(TRACEPARENT), tracer.start_as_current_span("receipt.attempt") as span:
        assert not span.is_recording()
        inner = line()
    assert inner["trace_id"] == TRACE_ID
    assert inner["span_id"] == f"{span.get_span_context().span_id:016x}" != SPAN_ID
    assert "trace_id" not in line()


def test_a_span_of_the_jobs_trace_already_current_is_kept() -> None:
    tracer = TracerProvider(sampler=_RecordWhenConsumed()).get_tracer("t")
    with job_trace(TRACEPARENT), tracer.start_as_current_span("activity") as span:
        with job_trace(TRACEPARENT):
            kept = line()
        with job_trace(f"00-{'1' * 32}-{SPAN_ID}-01"):
            other = line()
    assert kept["span_id"] == f"{span.get_span_context().span_id:016x}"
    # Another job's trace (a loop handling several jobs) replaces the current one.
    assert other["trace_id"] == "1" * 32 and other["span_id"] == SPAN_ID
