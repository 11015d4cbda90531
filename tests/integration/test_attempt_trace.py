"""The attempt's spans (in-memory span exporter): a failed attempt is an error in its job's trace,
with what the handler raised recorded, so an operator finds a failing job by its spans' status."""

from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from activities.handlers.context import HandlerContext, HandlerError
from receipts.store import Store
from roles.infra.tracing import configure_tracing
from tests.integration.test_attempt_activity import attempt_of, job_of, run


def attempt_span(exporter: InMemorySpanExporter, job_id: str) -> ReadableSpan:
    [span] = [
        s
        for s in exporter.get_finished_spans()
        if s.name == "receipt.attempt" and (s.attributes or {}).get("receipt.job_id") == job_id
    ]
    return span


async def test_a_failed_attempt_is_an_error_span_with_what_the_handler_raised(
    store: Store,
) -> None:
    exporter = InMemorySpanExporter()
    configure_tracing("receipt-test", processor=SimpleSpanProcessor(exporter))

    async def raises(ctx: HandlerContext) -> None:
        raise ValueError("the handler broke")

    async def refuses(ctx: HandlerContext) -> None:
        raise HandlerError("bad input", retryable=False)

    async def completes(ctx: HandlerContext) -> dict[str, int]:
        return {"answer": 42}

    class Unsayable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    async def unsayable(ctx: HandlerContext) -> None:
        raise Unsayable

    handlers = {
        "trace-raises": raises,
        "trace-refuses": refuses,
        "trace-ok": completes,
        "trace-unsayable": unsayable,
    }
    spans = {}
    for agent in handlers:
        job_id = await job_of(store, agent)
        await run(store, handlers, attempt_of(job_id, agent))
        spans[agent] = attempt_span(exporter, job_id)

    broke = spans["trace-raises"]
    assert broke.status.status_code is StatusCode.ERROR
    assert broke.status.description == "ValueError: the handler broke"
    [event] = [e for e in broke.events if e.name == "exception"]
    assert (event.attributes or {})["exception.type"] == "ValueError"
    assert "the handler broke" in str((event.attributes or {})["exception.stacktrace"])
    refused = spans["trace-refuses"]
    assert (refused.status.status_code, refused.status.description) == (
        StatusCode.ERROR,
        "bad input",
    )
    assert spans["trace-ok"].status.status_code is StatusCode.UNSET
    # An exception that cannot say what it is is recorded all the same (its job failed, settled).
    unsaid = spans["trace-unsayable"]
    assert unsaid.status.status_code is StatusCode.ERROR
    assert [e.name for e in unsaid.events] == ["exception"]
