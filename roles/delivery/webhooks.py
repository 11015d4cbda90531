"""The webhook deliverer: claims due per-organization webhook deliveries and posts them signed.

It runs in the driver role, beside the global callbacks: the driver already posts to the
outside world, is the one role every deployment runs, and holds no tenant's code (a worker runs
commands; worker-control runs the Factory). Several drivers may run it at once: a claim locks
its rows `SKIP LOCKED` and marks them claimed, so each try is made by one deliverer; a
deliverer that dies lets its claims lapse and another tries them again (the same `webhook-id`,
so a receiver drops a repeat).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx
from opentelemetry import trace

from activities import webhook_egress as egress
from activities.driver import callback_message_id, sign_webhook
from receipts import metrics, webhook_tries
from receipts import webhooks as hooks
from receipts.errors import UnansweredStorageError
from receipts.store import Store
from receipts.trace_context import current_traceparent, job_trace
from receipts.waits import within
from receipts.webhooks import Claimed, WebhookSettings

log = logging.getLogger("roles.delivery.webhooks")
_tracer = trace.get_tracer("receipt.webhooks")
# How late past the retry window a delivery's last try may be posted: the backoff cuts the last
# wait to end at the window, so that try is claimed just after it. Later than this, it waited
# behind a backlog, and is failed unposted (`expired`).
LAST_TRY_GRACE_MS = 60_000


@dataclass
class DeliveryPass:
    """What one pass's tries came to."""

    claimed: int = 0
    delivered: int = 0
    retried: int = 0
    failed: int = 0
    lapsed: int = 0  # not recorded (the database failed): its claim lapses, it is tried again
    superseded: int = 0  # posted after its claim lapsed and another deliverer took it: not recorded
    dropped: int = 0  # not posted: its subscription deleted (or its claim taken) since the claim


class WebhookDeliverer:
    """`run_once` claims what is due (at most `org_in_flight` of one organization in flight,
    `concurrency` in all) and posts it; `run` claims every poll interval while earlier posts are
    still in flight, so a slow receiver holds up only its own organization's share."""

    name = "webhook_deliverer"

    def __init__(self, store: Store, settings: WebhookSettings, http: httpx.AsyncClient):
        self.store = store
        self.settings = settings
        self.http = http
        self._in_flight: set[asyncio.Task[str]] = set()

    @property
    def claim_ms(self) -> int:
        """How long a claim holds: longer than a post can take (its DNS and its timeout)."""
        return 2 * self.settings.timeout_ms + 5_000

    async def _claim(self) -> list[Claimed]:
        free = self.settings.concurrency - len(self._in_flight)
        if free <= 0:
            return []
        return await hooks.claim(
            self.store, limit=free, per_org=self.settings.org_in_flight, lease_ms=self.claim_ms
        )

    async def run_once(self) -> DeliveryPass:
        """Claim what is due and post it; returns when every post of this pass is recorded."""
        claimed = await self._claim()
        outcomes = await asyncio.gather(*(self._try(d) for d in claimed))
        result = DeliveryPass(claimed=len(claimed))
        for outcome in outcomes:
            setattr(result, outcome, getattr(result, outcome) + 1)
        return result

    async def run(self, stop: asyncio.Event | None = None, grace_s: float = 0.0) -> None:
        """Claim and post until cancelled or `stop` is set; a failing claim is logged and tried
        at the next poll. Once `stop` is set (the role drains) it claims nothing more and
        returns when the posts in flight are recorded, or after `grace_s` (the posts still in
        flight then are cut: logged `webhook.drain_cut`, their claims lapse and another
        deliverer posts them again). Cut at once, a post its receiver was answering was heard
        twice, the second time a claim's length later."""
        interval = self.settings.poll_interval_ms / 1000
        metrics.LOOP_FAILED.labels(self.name)  # from 0: an alert's increase() sees the first
        stopping = stop or asyncio.Event()
        try:
            while not stopping.is_set():
                try:
                    for delivery in await self._claim():
                        task = asyncio.create_task(self._try(delivery))
                        self._in_flight.add(task)
                        task.add_done_callback(self._in_flight.discard)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the loop outlives a failing claim
                    metrics.LOOP_FAILED.labels(self.name).inc()
                    log.warning(
                        "webhook claim failed",
                        extra={"event": "loop.failed", "loop": self.name, "error": str(exc)},
                    )
                with contextlib.suppress(TimeoutError):
                    await within(stopping.wait(), interval)
            await self._drain(grace_s)
        finally:
            for task in self._in_flight:
                task.cancel()

    async def _drain(self, grace_s: float) -> None:
        """Wait up to `grace_s` for the posts in flight to be answered and recorded."""
        if not self._in_flight:
            return
        _, cut = await asyncio.wait(set(self._in_flight), timeout=grace_s)
        if cut:
            log.warning(
                "webhook posts still in flight at the end of the shutdown grace are cut; their "
                "claims lapse and they are posted again",
                extra={"event": "webhook.drain_cut", "posts": len(cut), "graceS": grace_s},
            )

    async def _try(self, delivery: Claimed) -> str:
        try:
            return await self._deliver(delivery)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one delivery's failure stops no other
            event = delivery.counted_as
            metrics.WEBHOOK_DELIVERIES.labels(event, "lapsed").inc()
            log.warning(
                # A record whose answer was lost and could not be read back may have been made.
                "webhook try's record unanswered, not known; unless it was made, its claim lapses "
                "and it is tried again"
                if isinstance(exc, UnansweredStorageError)
                else "webhook try not recorded; its claim lapses and it is tried again",
                exc_info=True,
                extra={
                    "event": "webhook.try_lost",
                    "deliveryId": delivery.delivery_id,
                    "error": str(exc),
                },
            )
            return "lapsed"

    async def _deliver(self, delivery: Claimed) -> str:
        """One try of `delivery`, recorded; its outcome (`delivered`, `retried`, `failed`; `dropped`
        unposted when its subscription was deleted since the claim).
        Whatever the check or the post raises is a failed try; only a failure to read or record
        it leaves the claim to lapse: the delivery is tried again."""
        started = time.monotonic()
        age_ms = (delivery.now - delivery.created_at).total_seconds() * 1000
        if age_ms >= self.settings.retry_for_ms + LAST_TRY_GRACE_MS:
            # Owed past the retry window (it waited behind its organization's backlog at a dead
            # endpoint): failed unposted, not posted days late, and its job may be pruned. The
            # try the backoff put at the window's end is posted (within the grace).
            error = "expired: not delivered within RECEIPT_WEBHOOK_RETRY_FOR_MS"
            return await self._record(delivery, "failed", None, error, started)
        data = await hooks.event_data(self.store, delivery)
        if data is None:
            error = "the event's subject no longer exists"
            return await self._record(delivery, "failed", None, error, started)
        # A job's event is posted in the job's trace (its post's `traceparent` names this try's
        # span, as a callback's does), and so are the try's log lines.
        job = data.get("job")
        traceparent = job.get("traceparent") if isinstance(job, dict) else None
        with (
            job_trace(traceparent),
            _tracer.start_as_current_span(
                "receipt.webhook",
                kind=trace.SpanKind.CLIENT,
                attributes={
                    "receipt.webhook_id": delivery.webhook_id,
                    "receipt.webhook_event": delivery.event,
                    "receipt.delivery_id": delivery.delivery_id,
                    "receipt.tries": delivery.tries + 1,
                },
            ),
        ):
            return await self._send(delivery, data, age_ms, started)

    async def _send(
        self, delivery: Claimed, data: dict[str, Any], age_ms: float, started: float
    ) -> str:
        """Check the target, post, and record the try (`_deliver`'s, in its span)."""
        status_code: int | None = None
        error: str | None = None
        body = hooks.body(delivery, data)
        timeout_s = self.settings.timeout_ms / 1000
        target: egress.Target | None = None
        try:
            target = await egress.check(delivery.url, self.settings, delivery.organization_id)
        except egress.EgressRefused as exc:
            error = f"refused: {exc}"
        except Exception as exc:  # a failed try too (as whatever the post raises)
            error = self._raised(delivery, exc)
        if target is not None:
            # The secret as it is now, not as the claim read it (a rotation since then signs
            # this post), and only while the delivery is still this claim's: a subscription
            # deleted since the claim is not posted to (its deliveries went with it).
            secret = await hooks.signing_secret(self.store, delivery)
            if secret is None:
                return self._dropped(delivery)
            status_code, error = await self._post(delivery, target, secret, body, timeout_s)
        if error is None:
            return await self._record(delivery, "delivered", status_code, None, started)
        tries = delivery.tries + 1
        if hooks.gives_up(tries, age_ms, self.settings):
            return await self._record(delivery, "failed", status_code, error, started)
        wait = hooks.retry_delay_ms(tries, self.settings.retry_base_ms, self.settings.retry_max_ms)
        # Never past the retry window: the last try is at its end at the latest.
        wait = int(min(wait, max(self.settings.retry_for_ms - age_ms, 0)))
        return await self._record(delivery, "retried", status_code, error, started, wait)

    async def _post(
        self,
        delivery: Claimed,
        target: egress.Target,
        secret: str,
        body: bytes,
        timeout_s: float,
    ) -> tuple[int | None, str | None]:
        """Post `body` signed with `secret`: the answer's status code and the try's error (None:
        a 2xx). Whatever the post raises is the try's error."""
        message_id = callback_message_id(delivery.message_key)
        timestamp = int(time.time())
        headers = {
            "content-type": "application/json",
            "user-agent": "Receipt-Webhooks/1",
            "webhook-id": message_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign_webhook(secret, message_id, timestamp, body),
        }
        if traceparent := current_traceparent():
            headers["traceparent"] = traceparent
        try:
            # The whole exchange within the timeout (httpx's bounds each read, so a receiver
            # trickling a byte at a time would hold the post, and its organization's slot).
            response = await within(
                egress.post(self.http, target, headers, body, timeout_s), timeout_s
            )
        except TimeoutError:
            return None, f"no answer within {timeout_s:g} s"
        except httpx.HTTPError as exc:
            return None, f"{type(exc).__name__}: {exc}"
        except Exception as exc:
            return None, self._raised(delivery, exc)
        status = response.status_code
        return status, None if 200 <= status < 300 else f"HTTP {status}"

    def _raised(self, delivery: Claimed, exc: Exception) -> str:
        """Anything else the check or the post raises (a URL httpx cannot send) is a failed try
        too: recorded, backed off and given up in time. Left to lapse, the claim would come
        back every claim_ms forever, and retention would keep its job."""
        error = f"{type(exc).__name__}: {exc}"
        log.warning(
            "webhook try raised",
            exc_info=True,
            extra={
                "event": "webhook.try_raised",
                "deliveryId": delivery.delivery_id,
                "error": error,
            },
        )
        return error

    def _dropped(self, delivery: Claimed) -> str:
        event = delivery.counted_as
        metrics.WEBHOOK_DELIVERIES.labels(event, "dropped").inc()
        log.info(
            "webhook delivery not posted: its subscription was deleted (or its claim taken)",
            extra={
                "event": "webhook.dropped",
                "webhookId": delivery.webhook_id,
                "deliveryId": delivery.delivery_id,
                "organizationId": delivery.organization_id,
            },
        )
        return "dropped"

    async def _record(
        self,
        delivery: Claimed,
        outcome: str,
        status_code: int | None,
        error: str | None,
        started: float,
        retry_ms: int = 0,
    ) -> str:
        status = {"delivered": "delivered", "failed": "failed", "retried": "pending"}[outcome]
        if error is not None:  # the try's span (`_deliver`), when it was posted
            trace.get_current_span().set_status(trace.StatusCode.ERROR, error)
        next_try = await webhook_tries.record_try(
            self.store,
            delivery,
            status=status,
            status_code=status_code,
            error=error,
            duration_ms=int((time.monotonic() - started) * 1000),
            retry_ms=retry_ms,
        )
        event = delivery.counted_as
        if next_try is None:
            # The try outlived its claim (a stalled loop), and another deliverer took the
            # delivery: its record stands, this try's does not (the receiver may have it twice,
            # under one webhook-id).
            metrics.WEBHOOK_DELIVERIES.labels(event, "superseded").inc()
            log.warning(
                "webhook try outlived its claim; not recorded",
                extra={
                    "event": "webhook.try_superseded",
                    "webhookId": delivery.webhook_id,
                    "deliveryId": delivery.delivery_id,
                    "organizationId": delivery.organization_id,
                    "tryOutcome": outcome,
                    "statusCode": status_code,
                },
            )
            return "superseded"
        metrics.WEBHOOK_DELIVERIES.labels(event, outcome).inc()
        log.log(
            logging.INFO if outcome == "delivered" else logging.WARNING,
            "webhook %s",
            outcome,
            extra={
                "event": f"webhook.{outcome}",
                "webhookId": delivery.webhook_id,
                "deliveryId": delivery.delivery_id,
                "organizationId": delivery.organization_id,
                "webhookEvent": delivery.event,
                "statusCode": status_code,
                "tries": delivery.tries + 1,
                "nextTryAt": next_try.isoformat() if next_try and outcome == "retried" else None,
                "error": error,
            },
        )
        return outcome
