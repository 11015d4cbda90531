"""The SQL statements' spans (psycopg's instrumentation) are recorded inside a span only (a
job's, a request's, a batch's): a background loop's polls outside any are not one single-span
trace each (an idle driver and worker-control made ~550 a minute)."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from receipts import assembly
from receipts.store import Store
from roles.infra.tracing import configure_tracing


async def test_a_statement_outside_any_span_is_not_a_trace_of_its_own(
    fresh: tuple[Store, str],
) -> None:
    _, url = fresh
    exporter = InMemorySpanExporter()
    configure_tracing("receipt-test", processor=SimpleSpanProcessor(exporter))
    store = await assembly.open_store(url, min_size=1, max_size=2)  # instrumented
    try:
        exporter.clear()
        async with store.connection() as conn:
            await conn.execute("SELECT 1 AS polled")
            with trace.get_tracer("test").start_as_current_span("receipt.attempt") as parent:
                await conn.execute("SELECT 2 AS traced")
    finally:
        await store.close()
    statements = {
        str((s.attributes or {}).get("db.statement")): s
        for s in exporter.get_finished_spans()
        if (s.attributes or {}).get("db.statement")
    }
    assert "SELECT 1 AS polled" not in statements
    traced = statements["SELECT 2 AS traced"]
    assert traced.parent is not None
    assert traced.parent.span_id == parent.get_span_context().span_id
    # Exported as the process's, as its other spans are.
    [attempt] = [s for s in exporter.get_finished_spans() if s.name == "receipt.attempt"]
    assert traced.resource.attributes["service.name"] == attempt.resource.attributes["service.name"]
