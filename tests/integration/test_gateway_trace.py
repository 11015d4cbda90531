"""A turn's model calls through the AI gateway are spans of the attempt's trace (in-memory span
exporter): one `receipt.gateway.call` per call, as long as its answer (a stream to its end), an
error when the provider refused it."""

from __future__ import annotations

import httpx
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from activities.gateway import Gateway
from roles.infra.tracing import configure_tracing
from tests.fake_provider import USAGE_IN, FakeProvider, running
from tests.integration.test_gateway import call, provider, turn


async def test_each_model_call_is_a_span_under_the_attempt() -> None:
    exporter = InMemorySpanExporter()
    configure_tracing("receipt-test", processor=SimpleSpanProcessor(exporter))
    with running(FakeProvider({"sk-good": "ok", "sk-no": "forbidden"})) as fake:
        providers = {
            "openai-main": provider("openai-main", "openai", fake.openai_url, "sk-good"),
            "openai-no": provider("openai-no", "openai", fake.openai_url, "sk-no"),
        }
        async with httpx.AsyncClient() as http:
            gateway = Gateway(providers, http)
            # The grant is made inside the attempt's span, as the handler makes it.
            with trace.get_tracer("test").start_as_current_span("receipt.attempt") as attempt:
                good, refused = turn(gateway, "openai-main"), turn(gateway, "openai-no", "job-2")
            assert (await call(good)).status_code == 200
            streamed = await call(good, stream=True)
            assert streamed.status_code == 200
            assert (await call(refused)).status_code >= 400
            await gateway.close()
    spans = [s for s in exporter.get_finished_spans() if s.name == "receipt.gateway.call"]
    assert len(spans) == 3
    parent = attempt.get_span_context()
    assert all(s.parent is not None and s.parent.span_id == parent.span_id for s in spans)
    ok = [s for s in spans if (s.attributes or {}).get("receipt.job_id") == "job-1"]
    assert [s.status.status_code for s in ok] == [StatusCode.UNSET, StatusCode.UNSET]
    assert all((s.attributes or {})["receipt.gateway.input_tokens"] == USAGE_IN for s in ok)
    assert all(s.end_time is not None and s.start_time is not None for s in ok)
    assert all(s.end_time > s.start_time for s in ok if s.end_time and s.start_time)
    [bad] = [s for s in spans if (s.attributes or {}).get("receipt.job_id") == "job-2"]
    assert bad.status.status_code is StatusCode.ERROR
