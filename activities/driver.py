"""The driver's activities: read the job and decide the next step; post callbacks."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import logging
import time
import uuid
from collections.abc import Callable
from datetime import datetime

import httpx
from opentelemetry import trace
from temporalio import activity

from activities.names import JOB_DRIVER_WORKFLOW, POST_CALLBACKS, PREPARE_DELIVERY
from activities.storage_retry import with_storage_retry
from receipts import deliveries, metrics
from receipts import operations as ops
from receipts.jobs import TERMINAL_STATUSES, Job
from receipts.kinds import redact_payload, route
from receipts.messages import CallbackRequest, DriverAction, DriverPlan
from receipts.plan import Step, next_step
from receipts.settings import Settings
from receipts.store import Store
from receipts.streams import dumps
from receipts.timing import JobTiming, TimingSettings, derive
from receipts.trace_context import current_traceparent, job_trace

log = logging.getLogger("activities.driver")
_tracer = trace.get_tracer("receipt.driver")
STALE_ERROR = "stale active job lost execution; retrying through driver"
ABORT_REASON = "abort requested"
CALLBACK_TIMEOUT_S = 5.0
CALLBACK_TRIES = 3
# A lease with no expiry to wait for (never written by this code): look again after this long.
UNKNOWN_WAIT_MS = 1_000


def sign_webhook(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """Standard-Webhooks signature: `v1,<base64 HMAC-SHA256(id.timestamp.body)>`.

    A `whsec_`-prefixed secret is base64-decoded, as Standard Webhooks defines; any other secret
    is used as UTF-8 bytes.
    """
    key = (
        base64.b64decode(secret.removeprefix("whsec_"))
        if secret.startswith("whsec_")
        else secret.encode()
    )
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def callback_headers(settings: Settings, message_id: str, body: bytes) -> dict[str, str]:
    """Headers of a callback post: JSON, the current span's `traceparent` (the job's trace, so
    the receiver's spans join it), optional bearer token, optional webhook signature."""
    headers = {"content-type": "application/json"}
    traceparent = current_traceparent()
    if traceparent:
        headers["traceparent"] = traceparent
    if settings.callback_token:
        headers["authorization"] = f"Bearer {settings.callback_token}"
    if settings.callback_signing_secret:
        timestamp = int(time.time())
        headers["webhook-id"] = message_id
        headers["webhook-timestamp"] = str(timestamp)
        headers["webhook-signature"] = sign_webhook(
            settings.callback_signing_secret, message_id, timestamp, body
        )
    return headers


def callback_message_id(key: str) -> str:
    """A callback's `webhook-id`: the same for every try of one post (`key` names the source,
    the event and the URL), so a receiver can drop a repeat."""
    return f"msg_{uuid.uuid5(uuid.NAMESPACE_URL, key).hex}"


async def post_callback(
    client: httpx.AsyncClient, settings: Settings, url: str, message_id: str, body: bytes
) -> str | None:
    """Post one callback body, signed; return None when the receiver took it (2xx), else why not.

    The timeout bounds the whole exchange (httpx's bounds each read: a receiver answering a byte
    at a time would hold the post, and a recovery pass awaiting it, for ever); the answer's body
    is never read (its status is all a callback needs, and a body could be any size)."""
    try:
        async with (
            asyncio.timeout(CALLBACK_TIMEOUT_S),
            client.stream(
                "POST",
                url,
                content=body,
                headers=callback_headers(settings, message_id, body),
                timeout=CALLBACK_TIMEOUT_S,
            ) as response,
        ):
            status = response.status_code
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    except TimeoutError:
        return f"TimeoutError: no answer within {CALLBACK_TIMEOUT_S:g} s"
    return None if status < 300 else f"HTTP {status}"


async def _post_tries(
    client: httpx.AsyncClient,
    settings: Settings,
    url: str,
    message_id: str,
    body: bytes,
    beat: Callable[[], None],
) -> str | None:
    """Post up to CALLBACK_TRIES times; the last error, or None once posted."""
    error: str | None = None
    for attempt in range(1, CALLBACK_TRIES + 1):
        beat()
        error = await post_callback(client, settings, url, message_id, body)
        if error is None:
            return None
        if attempt < CALLBACK_TRIES:
            await asyncio.sleep(0.5 * attempt)
    return error


async def post_callbacks(
    store: Store,
    settings: Settings,
    client: httpx.AsyncClient,
    job: Job,
    event: str,
    *,
    take_over: bool = False,
    beat: Callable[[], None] = lambda: None,
    stop: asyncio.Event | None = None,
) -> int:
    """Post `{event, job}` to each distinct configured URL, once per URL (claimed in the database;
    `take_over` claims one still held, as `deliveries.claim_callback` says). `beat` is called
    before each try (an activity's heartbeat). Once `stop` is set (the recovery loop's role
    drains) no URL is claimed any more: another driver posts the rest.

    Failures are logged and recorded; they never change the job. Returns the number posted.
    """
    posted = 0
    shown = {**job.to_json(), "payload": redact_payload(job.payload)}
    body = dumps({"event": event, "job": shown}).encode()
    for url in settings.callback_urls:
        if stop is not None and stop.is_set():
            break
        if not await deliveries.claim_callback(store, job.job_id, event, url, take_over=take_over):
            continue
        message_id = callback_message_id(f"{job.job_id}:{event}:{url}")
        # In the job's trace (the driver's activity, or the recovery loop with the job's own
        # traceparent): the post's `traceparent` names this span.
        with (
            job_trace(job.traceparent),
            _tracer.start_as_current_span(
                "receipt.callback",
                kind=trace.SpanKind.CLIENT,
                attributes={"receipt.job_id": job.job_id, "receipt.callback_event": event},
            ) as span,
        ):
            try:
                error = await _post_tries(client, settings, url, message_id, body, beat)
            except BaseException:
                # Cut off before its result (the activity cancelled: a driver stopping): the
                # claim is given back, so the activity's retry posts it rather than skipping a
                # claim younger than 30 s — a `dispatched` nothing else would ever post. The
                # receiver may get it twice then; the message id is the same.
                with contextlib.suppress(Exception):
                    await deliveries.release_callback(store, job.job_id, event, url)
                metrics.CALLBACKS.labels(event, "released").inc()
                raise
            status = "posted" if error is None else "failed"
            if error is not None:
                span.set_status(trace.StatusCode.ERROR, error)
            posted += error is None
            await deliveries.callback_result(store, job.job_id, event, url, status, error)
            metrics.CALLBACKS.labels(event, status).inc()
            log.log(  # a job's own INFO lines are two (README, RECEIPT_LOG_LEVEL): a post is DEBUG
                logging.DEBUG if status == "posted" else logging.WARNING,
                "callback %s",
                status,
                extra={
                    "event": "callback." + status,
                    "jobId": job.job_id,
                    "callbackEvent": event,
                    "error": error,
                },
            )
    if event in TERMINAL_STATUSES:
        await deliveries.settle_owed_callback(store, job.job_id, settings.callback_urls)
    return posted


def dispatch_plan(job: Job, settings: Settings, derived: JobTiming) -> DriverPlan:
    """The plan to deliver the next attempt of a queued, deliverable job, with the timing
    `derive` gave for it."""
    return DriverPlan(
        DriverAction.DISPATCH,
        job_status=job.status,
        attempt=next_step(job, None).attempt,
        task_queue=settings.queue(route(job.agent_id, job.kind)),
        agent_id=job.agent_id,
        lane=job.lane,
        kind=job.kind,
        lease_ms=derived.lease_ms,
        execution_timeout_ms=derived.execution_timeout_ms,
        heartbeat_ms=derived.heartbeat_interval_ms,
        driver_timeout_ms=derived.driver_timeout_ms,
        worker_lost_timeout_ms=settings.worker_lost_timeout_ms,
    )


class DriverActivities:
    """Activities of the `receipt-driver` task queue."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        timing: TimingSettings,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.timing = timing
        self.http = client or httpx.AsyncClient()
        if settings.callback_urls:  # each event's failures from 0: an alert sees the first
            for event in ("dispatched", *TERMINAL_STATUSES):
                metrics.CALLBACKS.labels(event, "failed")

    @activity.defn(name=PREPARE_DELIVERY)
    async def prepare_delivery(self, job_id: str) -> DriverPlan:
        """Read the job and decide: dispatch attempt n, wait, or stop.

        A stale active lease is failed (retryable) with the stale lease's own fence; an
        abort requested on a queued job cancels it. The driver never leases.
        """
        info = activity.info()
        plan = await with_storage_retry(lambda: self._plan(job_id), what="prepare delivery")
        if plan.kind:
            deliveries.ledger_workflow(
                self.store,
                workflow_id=info.workflow_id or "",
                run_id=info.workflow_run_id or "",
                job_id=job_id,
                kind=plan.kind,
                temporal_type=JOB_DRIVER_WORKFLOW,
                task_queue=info.task_queue,
                status="running",
            )
        return plan

    async def _plan(self, job_id: str) -> DriverPlan:
        job, now = await self.store.get_job_with_now(job_id)
        # What the driver writes and logs about the job, in the job's trace.
        with job_trace(job.traceparent if job else None):
            return await self._decide(job_id, job, now)

    async def _decide(self, job_id: str, job: Job | None, now: datetime) -> DriverPlan:
        plan = next_step(job, now, self.timing.active_stale_ms)
        if job is None or plan.step is Step.MISSING:
            return DriverPlan(DriverAction.MISSING)
        if plan.step is Step.TERMINAL:
            return DriverPlan(DriverAction.TERMINAL, job_status=job.status)
        if plan.step is Step.EXPIRED:
            # Delivery was lost after the lease: the receipt-level expiry requeues it (or
            # fails it past its attempts), exactly as the recovery scan would.
            expired = await ops.expire_lease(self.store, job_id)
            return _stale_failed(job, expired, "lease expired; delivery lost", "job.lease_expired")
        if plan.step is Step.STALE:
            out = await ops.fail_stale(
                self.store, job_id, active_stale_ms=self.timing.active_stale_ms, error=STALE_ERROR
            )
            return _stale_failed(job, out, "stale active lease failed", "driver.stale_failed")
        if plan.step is Step.ACTIVE:
            wait = _ms_until(plan.until, now, UNKNOWN_WAIT_MS)
            return DriverPlan(DriverAction.ACTIVE, job_status=job.status, wait_ms=wait + 500)
        if plan.step is Step.ABORT:
            out = await ops.cancel_queued(
                self.store, job_id, reason=job.abort_reason or ABORT_REASON
            )
            return DriverPlan(DriverAction.ABORTED, job_status=_status_after(out, job))
        if plan.step is Step.NOT_AVAILABLE:
            wait = _ms_until(plan.until, now, UNKNOWN_WAIT_MS)
            return DriverPlan(DriverAction.NOT_AVAILABLE, job_status=job.status, wait_ms=wait + 50)
        return dispatch_plan(job, self.settings, derive(job.agent_id, job.payload, self.timing))

    @activity.defn(name=POST_CALLBACKS)
    async def post_callbacks(self, request: CallbackRequest) -> int:
        """Post the job's callback for `request.event` to every configured URL, once per URL."""
        job = await with_storage_retry(lambda: self.store.get_job(request.job_id), what="read")
        if job is None:
            return 0
        # A retry of `dispatched` (its try killed with its driver, the claim left held) takes
        # the claim over at once: only this activity posts `dispatched`, and the terminal post
        # waits for it. It heartbeats, so a dead driver's try is retried within seconds.
        return await post_callbacks(
            self.store,
            self.settings,
            self.http,
            job,
            request.event,
            take_over=request.event == "dispatched" and activity.info().attempt > 1,
            beat=activity.heartbeat,
        )


def _status_after(out: ops.Outcome, job: Job) -> str:
    """The job's status after a write (as read before it, when the write found no job)."""
    return out.job.status if out.job else job.status


def _stale_failed(job: Job, out: ops.Outcome, message: str, event: str) -> DriverPlan:
    """The plan after a lost delivery's lease was expired or failed: look again."""
    log.warning(
        message,
        extra={"event": event, "jobId": job.job_id, "attempt": job.attempt, "status": out.status},
    )
    return DriverPlan(DriverAction.STALE_FAILED, job_status=_status_after(out, job))


def _ms_until(moment: datetime | None, now: datetime, unknown_ms: int) -> int:
    """Whole milliseconds from `now` until `moment` (0 once passed; `unknown_ms` without one)."""
    if moment is None:
        return unknown_ms
    return int(max((moment - now).total_seconds() * 1000, 0))
