"""A job the runtime creates itself (a schedule's firing, a watchdog tick, an operator's retry)
starts its own trace, as a post without a `traceparent` does (README, "Traces"): its `traceId` is
set, and every later step joins it, rather than each role's step being a trace of its own."""

from __future__ import annotations

import dataclasses
import secrets
from datetime import UTC, datetime

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.testing import ActivityEnvironment

from activities.schedules import ScheduleActivities
from activities.watchdog_tick import WatchdogActivities
from receipts import operations as ops
from receipts import retry as retries
from receipts.enqueue import enqueue, parse_enqueue
from receipts.schedules import store as schedules
from receipts.store import Store
from roles.infra.tracing import configure_tracing, trace_id_of
from tests.integration.helpers import body
from tests.integration.test_schedules import made


def exporter() -> InMemorySpanExporter:
    found = InMemorySpanExporter()
    configure_tracing("receipt-test", processor=SimpleSpanProcessor(found))
    return found


async def test_a_schedule_firings_job_is_the_trace_of_its_firing(store: Store) -> None:
    spans = exporter()
    sid = await made(store)
    at = datetime(2026, 12, 4, 17, 30, tzinfo=UTC).isoformat()
    fired = await ActivityEnvironment().run(ScheduleActivities(store).fire_schedule, sid, at)
    assert fired == "enqueued"
    state = await schedules.get(store, sid)
    assert state is not None and state.last_job_id is not None
    job = await store.get_job(state.last_job_id)
    assert job is not None and job.trace_id is not None and job.traceparent is not None
    [firing] = [s for s in spans.get_finished_spans() if s.name == "receipt.schedule.fire"]
    assert firing.context is not None and (firing.attributes or {})["receipt.outcome"] == fired
    assert job.trace_id == f"{firing.context.trace_id:032x}"
    assert job.traceparent.split("-")[2] == f"{firing.context.span_id:016x}"


async def test_a_retry_is_a_trace_of_its_own_linked_to_the_job_it_retries(store: Store) -> None:
    spans = exporter()
    trace_id = secrets.token_hex(16)
    traced = dataclasses.replace(
        parse_enqueue("codex", body(maxAttempts=1)),
        traceparent=f"00-{trace_id}-{secrets.token_hex(8)}-01",
    )
    job = (await enqueue(store, traced)).job
    assert job.trace_id == trace_id
    started = await ops.start_attempt(store, job.job_id, attempt=1, worker_id="w", lease_ms=60_000)
    assert started.ok
    failed = await ops.fail(store, job.job_id, worker_id="w", attempt=1, error="x", retryable=False)
    assert failed.ok
    outcome = await retries.retry(store, job.job_id, organization_id="org-a", admin=False)
    assert outcome.retry is not None
    again = outcome.retry
    assert again.trace_id is not None and again.trace_id == trace_id_of(again.traceparent)
    assert again.trace_id != job.trace_id
    [span] = [s for s in spans.get_finished_spans() if s.name == "receipt.retry"]
    assert span.context is not None and f"{span.context.trace_id:032x}" == again.trace_id
    # The retried job's trace, one click away.
    assert [f"{link.context.trace_id:032x}" for link in span.links] == [trace_id]


async def test_a_watchdog_ticks_job_is_the_trace_of_its_tick(store: Store) -> None:
    spans = exporter()
    at = datetime(2026, 12, 4, 17, 30, tzinfo=UTC).isoformat()
    job_id = await ActivityEnvironment().run(WatchdogActivities(store).enqueue_watchdog, at)
    job = await store.get_job(job_id)
    assert job is not None and job.trace_id is not None
    [tick] = [s for s in spans.get_finished_spans() if s.name == "receipt.watchdog.tick"]
    assert tick.context is not None and job.trace_id == f"{tick.context.trace_id:032x}"
