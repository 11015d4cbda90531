"""Traces (in-memory span exporter): one trace from the enqueue request to the settlement, the
request span of each answer the enqueue gate gives, and the span of a batch of posts' writes."""

from __future__ import annotations

import asyncio

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingInterceptor

from receipts import assembly
from receipts.sql import query
from receipts.store import Store
from roles.infra.tracing import configure_tracing
from tests.integration.api_support import AS_A, api_client, enqueue_body, rid
from tests.integration.delivery.conftest import running_stack, wait_for_status


async def test_a_job_is_one_trace_from_the_api_through_workflows_to_settlement(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    exporter = InMemorySpanExporter()
    configure_tracing("receipt-test", processor=SimpleSpanProcessor(exporter))
    traced = await Client.connect(
        client.service_client.config.target_host, interceptors=[TracingInterceptor()]
    )
    body = enqueue_body(payload_extra={"task": {"command": ["true"]}})
    # Connections opened after tracing is configured carry the psycopg instrumentation.
    store = await assembly.open_store(fresh_db, min_size=1, max_size=10)
    async with (
        running_stack(traced, store, fresh_db),
        api_client(fresh_db, store=store) as api,
    ):
        response = await api.post("/agents/codex/jobs", json=body, headers=AS_A)
        assert response.status_code == 202
        job_id = rid(response.json()["job"]["jobId"])  # the runtime's (organization-scoped) id
        done = await wait_for_status(fresh_store, job_id)
    await store.close()
    assert done.status == "completed"
    assert done.trace_id is not None and len(done.trace_id) == 32
    enqueued = (await fresh_store.read_stream(f"jobs/{job_id}"))[0]
    assert enqueued.data["traceId"] == done.trace_id

    spans = [
        s
        for s in exporter.get_finished_spans()
        if s.context is not None and f"{s.context.trace_id:032x}" == done.trace_id
    ]
    names = {s.name for s in spans}
    for expected in (
        "receipt.enqueue",
        "receipt.dispatch",
        "StartWorkflow:JobDriver",
        "RunWorkflow:JobDriver",
        "StartActivity:execute_attempt",
        "RunActivity:execute_attempt",
        "receipt.settle",
    ):
        assert expected in names, (expected, sorted(names))
    # The SQL of the settlement is a child of the settle span.
    settle = next(s for s in spans if s.name == "receipt.settle")
    assert any(
        s.parent is not None and s.parent.span_id == settle.context.span_id
        for s in spans
        if s is not settle
    )


async def test_the_enqueue_gate_names_the_route_in_the_request_span_of_each_answer(
    db_url: str,
) -> None:
    # The gate answers both of these itself (roles/api/gate.py): the enqueue, and the 429 of an
    # organization out of tokens. FastAPI's request span names the route as the router would.
    exporter = InMemorySpanExporter()
    configure_tracing("receipt-test", processor=SimpleSpanProcessor(exporter))
    async with api_client(db_url, org_enqueue_rate=1e-6, org_enqueue_burst=1) as limited:
        for status in (202, 429):
            response = await limited.post("/agents/codex/jobs", json=enqueue_body(), headers=AS_A)
            assert response.status_code == status, response.text
    requests = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.SERVER]
    assert [(s.name, (s.attributes or {}).get("http.response.status_code")) for s in requests] == [
        ("POST /agents/{agentId}/jobs", 202),
        ("POST /agents/{agentId}/jobs", 429),
    ]
    assert all((s.attributes or {}).get("http.route") == "/agents/{agentId}/jobs" for s in requests)


async def test_posts_written_together_link_the_batch_s_span_which_holds_its_sql(
    fresh_db: str,
) -> None:
    # Concurrent posts' jobs are written by one statement (receipts/enqueue_batch.py): its SQL
    # is the child of a `receipt.enqueue_batch` span linked from each post written in it, not
    # of some other post's span that ended meanwhile.
    exporter = InMemorySpanExporter()
    configure_tracing("receipt-test", processor=SimpleSpanProcessor(exporter))
    store = await assembly.open_store(fresh_db, min_size=1, max_size=10)  # instrumented
    async with api_client(fresh_db, store=store) as api:
        posts = await asyncio.gather(
            *(api.post("/agents/codex/jobs", json=enqueue_body(), headers=AS_A) for _ in range(8))
        )
    await store.close()
    assert [p.status_code for p in posts] == [202] * 8
    spans = exporter.get_finished_spans()
    posted = {s.context.span_id for s in spans if s.name == "receipt.enqueue" and s.context}
    batches = [s for s in spans if s.name == "receipt.enqueue_batch"]
    assert batches
    linked = [link.context.span_id for batch in batches for link in batch.links]
    assert len(linked) == sum(int((b.attributes or {})["receipt.jobs"]) for b in batches)
    assert set(linked) <= posted and len(set(linked)) == len(linked)
    for batch in batches:
        assert batch.context is not None and batch.parent is None  # a trace of its own
        sql = [
            s for s in spans if s.parent is not None and s.parent.span_id == batch.context.span_id
        ]
        statements = [str((s.attributes or {}).get("db.statement", "")) for s in sql]
        assert len(statements) == 2, statements  # the batch's read and its statement
        assert query("enqueue_caps_many") in statements[0]
        assert query("enqueue_new_many") in statements[1]
