"""A webhook post of a job's event is in the job's trace (in-memory span exporter): a
`receipt.webhook` span there, its post's `traceparent` naming it, and the deliverer's log line of
the try naming the trace, as a callback's are."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets

import httpx
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from receipts import operations as ops
from receipts import webhooks as hooks
from receipts.enqueue import enqueue, parse_enqueue
from receipts.store import Store
from roles.delivery.webhooks import WebhookDeliverer
from roles.infra.logs import trace_fields
from roles.infra.tracing import configure_tracing
from tests.integration.helpers import body
from tests.integration.test_webhooks import ALLOWED, LEASE, Receiver


class TraceFields(logging.Handler):
    """Keeps each record's trace fields as the role's JSON formatter writes them."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str | None]] = []

    def emit(self, record: logging.LogRecord) -> None:
        event = str(getattr(record, "event", ""))
        if event.startswith("webhook."):
            self.seen.append((event, trace_fields().get("trace_id")))


async def test_a_jobs_webhook_post_is_a_span_of_the_jobs_trace(
    fresh: tuple[Store, str], caplog: pytest.LogCaptureFixture
) -> None:
    store, _ = fresh
    caplog.set_level(logging.INFO, logger="roles.delivery.webhooks")
    exporter = InMemorySpanExporter()
    configure_tracing("receipt-test", processor=SimpleSpanProcessor(exporter))
    receiver = Receiver(statuses={"/hook": [500]})  # the first try fails: tried again
    server = await asyncio.start_server(receiver.handle, "127.0.0.1", 0)
    receiver.port = server.sockets[0].getsockname()[1]
    settings = {"url": receiver.url("/hook"), "events": ["job.completed"], "description": None}
    await hooks.create(store, "org-a", hooks.parse_create(settings), max_per_organization=20)
    trace_id, caller = secrets.token_hex(16), secrets.token_hex(8)
    traced = dataclasses.replace(
        parse_enqueue("codex", body(maxAttempts=1)),
        trace_id=trace_id,
        traceparent=f"00-{trace_id}-{caller}-01",
    )
    job_id = (await enqueue(store, traced)).job.job_id
    assert (await ops.start_attempt(store, job_id, attempt=1, worker_id="w1", lease_ms=LEASE)).ok
    assert (await ops.complete(store, job_id, worker_id="w1", attempt=1)).ok
    logs = TraceFields()
    logger = logging.getLogger("roles.delivery.webhooks")
    logger.addHandler(logs)
    try:
        async with server, httpx.AsyncClient() as http:
            deliverer = WebhookDeliverer(store, ALLOWED, http)
            for _ in range(100):
                if (await deliverer.run_once()).delivered:
                    break
                await asyncio.sleep(0.05)
    finally:
        logger.removeHandler(logs)

    spans = [s for s in exporter.get_finished_spans() if s.name == "receipt.webhook"]
    assert len(spans) == 2
    assert all(f"{s.context.trace_id:032x}" == trace_id for s in spans if s.context)
    assert all(s.parent is not None and f"{s.parent.span_id:016x}" == caller for s in spans)
    assert [s.status.status_code for s in spans] == [StatusCode.ERROR, StatusCode.UNSET]
    sent = [p.headers.get("traceparent", "").split("-") for p in receiver.at("/hook")]
    assert [(p[1], p[2]) for p in sent] == [
        (trace_id, f"{s.context.span_id:016x}") for s in spans if s.context
    ]
    assert logs.seen == [("webhook.retried", trace_id), ("webhook.delivered", trace_id)]
