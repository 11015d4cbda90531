"""One trace per job, from the caller: real role processes (api, driver, worker-codex) export
their spans over OTLP/HTTP to a receiver the test runs; a job posted with a `traceparent` is
that trace in every process, its callback post carries it, and every log line about the job
names it."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from receipts.store import Store
from roles.infra.ports import free_port
from tests.e2e.conftest import task
from tests.e2e.roles_harness import RoleProcesses, wait_for
from tests.integration.api_support import AS_A, TOKENS, enqueue_body, rid, wait_healthz
from tests.integration.delivery.receiver import Receiver

pytestmark = pytest.mark.e2e


@dataclass(frozen=True)
class Span:
    """One exported span, as the OTLP receiver got it."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str


def spans_of(receiver: Receiver) -> list[Span]:
    """Every span the roles exported so far (OTLP/HTTP protobuf bodies)."""
    found = []
    for request in receiver.requests:
        for resource in ExportTraceServiceRequest.FromString(request.body).resource_spans:
            service = next(
                a.value.string_value
                for a in resource.resource.attributes
                if a.key == "service.name"
            )
            for scope in resource.scope_spans:
                for span in scope.spans:
                    found.append(
                        Span(
                            service,
                            span.name,
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                        )
                    )
    return found


def job_log_lines(procs: RoleProcesses, job_id: str) -> list[tuple[str, dict[str, object]]]:
    """`(log file, record)` of every JSON log line of any role that names the job."""
    lines = []
    for path in sorted(procs.log_dir.glob("*.log")):
        for raw in path.read_text(errors="replace").splitlines():
            if raw.startswith("{"):
                record = json.loads(raw)
                if record.get("jobId") == job_id:
                    lines.append((path.name, record))
    return lines


@dataclass
class Run:
    """One job posted with a caller's traceparent to real roles, run until settled, the roles
    stopped: what the test then reads."""

    trace_id: str
    caller_span: str
    job_id: str
    trace_of_job: str | None
    procs: RoleProcesses
    collector: Receiver
    callbacks: Receiver


async def run_one_job(store: Store, roles: Callable[..., RoleProcesses], *, export: bool) -> Run:
    """Post a job with a chosen traceparent to api, driver and worker-codex (exporting spans to
    a receiver when `export`), wait for it to complete and its two callbacks (dispatched,
    completed) to arrive, stop the roles."""
    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    async with Receiver() as collector, Receiver() as callbacks:
        port = free_port()
        # Spans are exported every 60 s, so the roles hold this job's until they stop: each
        # flushes them on its way out.
        otlp = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url.removesuffix("/hook"),
            "OTEL_BSP_SCHEDULE_DELAY": "60000",
        }
        procs = roles(
            RECEIPT_API_PORT=str(port),
            RECEIPT_API_TOKENS=TOKENS,
            RECEIPT_EVENT_CALLBACK_URL=callbacks.url,
            RECEIPT_LOG_FORMAT="json",
            RECEIPT_LOG_LEVEL="debug",
            **(otlp if export else {}),
        )
        for role in ("api", "driver", "worker-codex"):
            procs.start(role)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthz(url)
            async with httpx.AsyncClient(base_url=url) as client:
                answer = await client.post(
                    "/agents/codex/jobs",
                    json=enqueue_body(payload_extra=task("true")),
                    headers={**AS_A, "traceparent": f"00-{trace_id}-{caller_span}-01"},
                )
            assert answer.status_code == 202, answer.text
            job_id = rid(answer.json()["job"]["jobId"])
            done = await wait_for(store, job_id, ("completed",), 60)
            await callbacks.wait_for(2)
        except BaseException:
            print(procs.logs())
            raise
        # The roles flush to the receiver on this loop: the stop waits in a thread.
        await asyncio.to_thread(procs.stop_all)
    return Run(trace_id, caller_span, job_id, done.trace_id, procs, collector, callbacks)


def check_log_lines(run: Run, span_ids: set[str] | None) -> None:
    """Every log line about the job, in every role, names its trace (and, when the spans were
    exported, one of them)."""
    lines = job_log_lines(run.procs, run.job_id)
    files = {name.split(".")[0] for name, _ in lines}
    assert {"api", "driver", "worker-codex"} <= files, files
    events = {record.get("event") for _, record in lines}
    assert {"api.enqueued", "attempt.started", "attempt.settled", "callback.posted"} <= events
    for name, record in lines:
        assert record.get("trace_id") == run.trace_id, (name, record)
        span_id = str(record.get("span_id"))
        assert len(span_id) == 16 and span_id != run.caller_span, (name, record)
        assert span_ids is None or span_id in span_ids, (name, record)


async def test_a_job_posted_with_a_traceparent_is_one_trace_through_every_role(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses]
) -> None:
    run = await run_one_job(e2e_store[0], roles, export=True)
    trace_id, caller_span = run.trace_id, run.caller_span
    collector, callbacks = run.collector, run.callbacks
    assert run.trace_of_job == trace_id
    spans = [s for s in spans_of(collector) if s.trace_id == trace_id]
    by_id = {s.span_id: s for s in spans}
    names = {(s.service, s.name) for s in spans}
    for expected in (
        ("receipt-api", "receipt.enqueue"),
        ("receipt-driver", "receipt.dispatch"),
        ("receipt-driver", "RunWorkflow:JobDriver"),
        ("receipt-worker-codex", "RunActivity:execute_attempt"),
        ("receipt-worker-codex", "receipt.attempt"),
        ("receipt-worker-codex", "receipt.settle"),
        ("receipt-driver", "receipt.callback"),
    ):
        assert expected in names, (expected, sorted(names))
    # The caller's span is the one root: every span's parent is the caller's or a span of the
    # trace, and the api's request span hangs from the caller's.
    roots = [s for s in spans if s.parent_id == caller_span]
    assert [(s.service, s.name) for s in roots] == [("receipt-api", "POST /agents/{agentId}/jobs")]
    orphans = [s for s in spans if s.parent_id != caller_span and s.parent_id not in by_id]
    assert not orphans, orphans

    def ancestors(span: Span) -> list[str]:
        chain = []
        while span.parent_id in by_id:
            span = by_id[span.parent_id]
            chain.append(span.name)
        return chain

    [settle] = [s for s in spans if s.name == "receipt.settle"]
    assert ancestors(settle)[:2] == ["receipt.attempt", "RunActivity:execute_attempt"]
    assert "receipt.enqueue" in ancestors(settle) and "receipt.dispatch" in ancestors(settle)
    # The callback posts: each in a span of the job's trace, named by its traceparent.
    callback_spans = {s.span_id for s in spans if s.name == "receipt.callback"}
    sent = [r.headers["traceparent"].split("-") for r in callbacks.requests]
    assert len(sent) == 2
    assert all(p[1] == trace_id and p[2] in callback_spans for p in sent), (sent, callback_spans)
    check_log_lines(run, set(by_id))


async def test_without_an_exporter_the_job_still_carries_the_callers_trace_id(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses]
) -> None:
    """Spans not recorded (no OTLP endpoint, Temporal's interceptor off): the job's stored
    traceparent is attached where the work happens, so its trace id still reaches every log
    line and the callbacks."""
    run = await run_one_job(e2e_store[0], roles, export=False)
    assert run.trace_of_job == run.trace_id
    assert not run.collector.requests
    sent = [r.headers["traceparent"].split("-") for r in run.callbacks.requests]
    assert [p[1] for p in sent] == [run.trace_id, run.trace_id]
    check_log_lines(run, None)
