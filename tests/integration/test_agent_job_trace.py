"""An agent job's wakeup post (the owner session woken: it waits on its user, or it ended) is in
the agent job's trace (in-memory span exporter), as a queue job's callback is in its job's: a
`receipt.wakeup_callback` span there, its post's `traceparent` naming it, its log line naming
the trace."""

from __future__ import annotations

import logging
import secrets

import httpx
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from receipts.agent_jobs import lifecycle
from receipts.agent_jobs.registry import AgentJobSettings
from receipts.settings import Settings
from receipts.store import Store
from roles.delivery.agent_jobs import AgentJobDispatcher
from roles.infra.logs import trace_fields
from roles.infra.tracing import configure_tracing
from tests.integration.delivery.receiver import Receiver
from tests.integration.test_agent_jobs import current, play_turn, request


async def test_a_wakeup_post_is_a_span_of_the_agent_jobs_trace(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    exporter = InMemorySpanExporter()
    configure_tracing("receipt-test", processor=SimpleSpanProcessor(exporter))
    trace_id = secrets.token_hex(16)
    traceparent = f"00-{trace_id}-{secrets.token_hex(8)}-01"
    job, _ = await lifecycle.create(
        store, request(f"agent-{secrets.token_hex(3)}", traceparent=traceparent)
    )
    seen: list[str | None] = []

    class Traced(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            # This agent job's post only: the dispatcher posts every wakeup of the day not yet
            # posted to the URL (the other tests' in a shared database too).
            source = str(getattr(record, "sourceId", ""))
            if getattr(record, "event", None) == "agent_job.wakeup_callback" and (
                source.startswith(job.agent_job_id)
            ):
                seen.append(trace_fields().get("trace_id"))

    logger = logging.getLogger("roles.delivery.agent_jobs")
    caplog.set_level(logging.INFO, logger=logger.name)
    logger.addHandler(handler := Traced())
    try:
        async with Receiver() as receiver, httpx.AsyncClient() as http:
            settings = Settings(RECEIPT_EVENT_CALLBACK_URL=receiver.url)
            posting = AgentJobDispatcher(
                store, None, AgentJobSettings(), callbacks=settings, http=http
            )
            await posting.run_once()
            await play_turn(
                store,
                await current(store, job.agent_job_id),
                {"outcome": "needs_input", "question": "q", "toolCallId": "c"},
            )
            await posting.run_once()
    finally:
        logger.removeHandler(handler)
    [sent] = [r for r in receiver.requests if job.agent_job_id in r.body.decode()]
    spans = [s for s in exporter.get_finished_spans() if s.name == "receipt.wakeup_callback"]
    [span] = [
        s for s in spans if (s.attributes or {}).get("receipt.agent_job_id") == job.agent_job_id
    ]
    assert span.context is not None and f"{span.context.trace_id:032x}" == trace_id
    assert sent.headers.get("traceparent", "").split("-")[1:3] == [
        trace_id,
        f"{span.context.span_id:016x}",
    ]
    assert seen == [trace_id]


async def test_the_dispatchers_lines_about_an_agent_job_carry_its_trace(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """agent_job.claimed, agent_job.turn_settled and agent_job.wakeup name the agent job but were
    written in no trace (the dispatcher's pass is none): an operator following the agent job's
    trace id lost them."""
    trace_id = secrets.token_hex(16)
    traceparent = f"00-{trace_id}-{secrets.token_hex(8)}-01"
    job, _ = await lifecycle.create(
        store, request(f"agent-{secrets.token_hex(3)}", traceparent=traceparent)
    )
    seen: dict[str, str | None] = {}

    class Traced(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            event = str(getattr(record, "event", ""))
            if getattr(record, "agentJobId", None) == job.agent_job_id:
                seen[event] = trace_fields().get("trace_id")

    loggers = [logging.getLogger(n) for n in ("receipts.agent_jobs", "roles.delivery.agent_jobs")]
    caplog.set_level(logging.INFO)
    for logger in loggers:
        logger.addHandler(Traced())
    try:
        dispatcher = AgentJobDispatcher(store, None, AgentJobSettings())
        await dispatcher.run_once()
        await play_turn(
            store,
            await current(store, job.agent_job_id),
            {"outcome": "needs_input", "question": "q", "toolCallId": "c"},
        )
        await dispatcher.run_once()
    finally:
        for logger in loggers:
            logger.handlers = [h for h in logger.handlers if not isinstance(h, Traced)]
    wanted = ("agent_job.claimed", "agent_job.turn_settled", "agent_job.wakeup")
    assert {event: seen.get(event) for event in wanted} == dict.fromkeys(wanted, trace_id), seen
