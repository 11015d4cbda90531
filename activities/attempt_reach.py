"""What Temporal hears of a running attempt (`activities/attempt.py`): its activity heartbeats,
and, for a worker that can no longer be heard, the stop of its handler before a redelivery's.

Temporal delivers the attempt again once it has heard nothing for the activity's heartbeat
timeout; the new delivery takes the lease over and starts its handler `TAKEOVER_GRACE_S` later.
A worker cut from Temporal only hears of that takeover on its job's notice (PostgreSQL); one
cut from PostgreSQL only is still heard by Temporal, so nobody takes its attempt. One cut from
both would hear of nothing until PostgreSQL came back, its handler running beside the new one
(9 s in tests/e2e/test_outages.py, tens of seconds at a pool's and the storage retry's waits).
So, while an attempt runs past its first activity heartbeat, the process asks Temporal about
once a `PROBE_S` whether it answers (`TemporalReach`); once it has not answered for `quiet_s`,
the attempt reads its job, bounded by `READ_BOUND_S`: still its lease, it runs on (a Temporal
outage: Temporal hears nobody else either); unreadable, or another delivery's lease, it stops
its handler (`attempt.cut_off`, `receipt_attempts_cut_off_total{outcome}`).

The bound (`quiet_s`). Let `a` be when this process last sent a probe Temporal answered, or the
attempt's delivery, `T` the heartbeat timeout, `b` the beat interval (`temporal_beat_s`; the
worker sends every beat, unthrottled: `HEARTBEAT_THROTTLE`, roles/delivery/runtime.py). A
beat went out in (a - b, a] over the connection that carried the probe, so Temporal's deadline
is no sooner than a - b + T, and the takeover's handler starts no sooner than
a + T - b + TAKEOVER_GRACE_S. The attempt looks every `PROBE_S`: it reads by
a + quiet_s + PROBE_S, and its handler is cancelled by a + quiet_s + PROBE_S + READ_BOUND_S.
With quiet_s = T - b - PROBE_S - READ_BOUND_S - `QUIET_MARGIN_S` that is a + T - b -
QUIET_MARGIN_S: QUIET_MARGIN_S + TAKEOVER_GRACE_S (1.5 s) before the earliest takeover's
handler, for the cancellation itself (a command killed: milliseconds) and a busy event loop. At
the spec's 30 s timeout (b = 5 s) the read comes 22 s into Temporal's silence; at the 6 s of
tests/e2e/test_outages.py, 2 s (`QUIET_FLOOR_S`): the handler stopped 2.3-2.4 s after the cut,
the takeover's started 7.5-7.6 s after it. The floor holds the bound down to T of about 5 s
(0.75 T + 0.5 > 4 s); a shorter heartbeat timeout (a lease under ~8 s, or
`RECEIPT_WORKER_LOST_TIMEOUT_MS` under 5 000) can see the takeover's handler start first. Without
`HEARTBEAT_THROTTLE` Temporal's last beat may be 0.8 T older than `a`: in that test, cut 5.9 s
into the attempt, the takeover's handler started 3.1 s after the cut, not 5.5 s.

What it costs: nothing for an attempt that ends within one beat interval (the watch sleeps
until then: one task, ~10 us); past it, one GetSystemInfo call a second per process however
many attempts run, one activity heartbeat call a beat per attempt (not one a 0.8 T), and during
a Temporal outage a read of each running attempt's job a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities.attempt_watch import taken_over
from activities.fence import AttemptFence
from receipts import metrics
from receipts.waits import within

log = logging.getLogger("activities.attempt")

# Temporal heartbeats: a quarter of the heartbeat timeout, at most this often and at least
# this rarely.
TEMPORAL_BEATS_PER_TIMEOUT = 4
TEMPORAL_BEAT_MIN_S, TEMPORAL_BEAT_MAX_S = 0.2, 5.0
# The attempt worker's `max_heartbeat_throttle_interval`: every beat is sent. The SDK's
# default throttles what it sends to 0.8 × the timeout, so Temporal's last beat from a worker
# cut off could be that old and a redelivery could come 0.2 × T after the cut (1.2 s at a 6 s
# timeout), sooner than a worker could tell. A beat a `b` instead of one a 0.8 × T: at the
# spec's 30 s timeout, one activity heartbeat call per running attempt every 5 s, not 24 s.
HEARTBEAT_THROTTLE = timedelta(seconds=TEMPORAL_BEAT_MIN_S)
# How often, and how long, the process asks Temporal whether it answers.
PROBE_S = 1.0
# How long the attempt's read of its job may take once Temporal has gone quiet.
READ_BOUND_S = 1.0
QUIET_MARGIN_S = 1.0
QUIET_FLOOR_S = 2 * PROBE_S
# A probe refused with these got no answer from Temporal; any other status is an answer.
UNANSWERED = (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED)


class CutOff(Exception):
    """Neither Temporal nor PostgreSQL answered the attempt's worker: its handler was stopped.
    Raised from the activity so that Temporal, once it hears the worker again without having
    delivered the attempt elsewhere, delivers it again at once (not after the lease)."""


def temporal_beat_s(timeout_s: float) -> float:
    """The seconds between the activity heartbeats of an attempt whose heartbeat timeout is
    `timeout_s`."""
    per = timeout_s / TEMPORAL_BEATS_PER_TIMEOUT
    return min(TEMPORAL_BEAT_MAX_S, max(TEMPORAL_BEAT_MIN_S, per))


def quiet_s(timeout_s: float) -> float:
    """How long Temporal may not answer before a running attempt reads its job (the bound in
    the module docstring), at least two probes: one a probe answers leaves the attempt up to
    `PROBE_S` (and the answer's time) behind it, so a shorter wait read the job at every look
    and stopped the handler in an outage of PostgreSQL alone."""
    spare = timeout_s - temporal_beat_s(timeout_s) - PROBE_S - READ_BOUND_S - QUIET_MARGIN_S
    return max(QUIET_FLOOR_S, spare)


async def temporal_heartbeats(timeout: timedelta | None, details: Any) -> None:
    """Tell Temporal the attempt's worker is alive, every few seconds, until cancelled.

    Decoupled from the `job.heartbeat` receipts (which keep the lease's cadence): Temporal
    redelivers the attempt once it hears nothing for the heartbeat timeout
    (`RECEIPT_WORKER_LOST_TIMEOUT_MS`), so a dead worker is found in seconds, not in two
    receipt cadences (minutes at the spec's leases).
    """
    if timeout is None:
        return
    interval = temporal_beat_s(timeout.total_seconds())
    # The first beat after one interval, not at once: the timeout counts from the activity's
    # start, and an attempt that ends sooner (most) costs Temporal no heartbeat at all.
    while True:
        await asyncio.sleep(interval)
        activity.heartbeat(details)


class TemporalReach:
    """When Temporal last answered this process: a probe (GetSystemInfo, bounded by `PROBE_S`)
    every `PROBE_S` while at least one attempt watches, none otherwise."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.answered_at = 0.0  # time.monotonic() of the last answered probe's sending
        self._watchers = 0
        self._probing: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def watched(self) -> Iterator[None]:
        """Probe while the block runs (and while any other watcher's does)."""
        self._watchers += 1
        if self._probing is None or self._probing.done():
            self._probing = asyncio.create_task(self._probe(), name="temporal-reach")
        try:
            yield
        finally:
            self._watchers -= 1
            if not self._watchers:
                # Forgotten at once: cancelled, it is not done until its next step, and a
                # watch begun before then must probe anew, not lean on it.
                self._probing.cancel()
                self._probing = None

    async def _probe(self) -> None:
        while True:
            sent = time.monotonic()
            if await self._answers():
                self.answered_at = max(self.answered_at, sent)
            await asyncio.sleep(max(0.0, PROBE_S - (time.monotonic() - sent)))

    async def _answers(self) -> bool:
        try:
            await within(
                self.client.workflow_service.get_system_info(
                    GetSystemInfoRequest(), timeout=timedelta(seconds=PROBE_S)
                ),
                PROBE_S,
            )
        except RPCError as exc:
            return exc.status not in UNANSWERED  # a refusal is an answer
        except Exception:
            return False
        return True


async def until_cut_off(
    reach: TemporalReach, fence: AttemptFence, delivered: float, timeout_s: float
) -> tuple[str, str]:
    """Return `(outcome, detail)` once Temporal has not answered this process for `quiet_s`
    and the job cannot be read (`unreadable`) or another delivery holds its lease
    (`taken_over`); a delivered attempt (at `delivered`, time.monotonic()) is watched from its
    first activity heartbeat on."""
    beat = temporal_beat_s(timeout_s)
    quiet = quiet_s(timeout_s)
    await asyncio.sleep(max(0.0, delivered + beat - time.monotonic()))
    with reach.watched():
        while True:
            await asyncio.sleep(PROBE_S)
            silent = time.monotonic() - max(delivered, reach.answered_at)
            if silent <= quiet:
                continue
            try:
                job = await within(fence.store.get_job(fence.job_id), READ_BOUND_S)
            except Exception as exc:
                detail = f"{type(exc).__name__}: {exc}".rstrip(": ")
                return (
                    "unreadable",
                    f"Temporal silent {silent:.1f} s, the job unreadable ({detail})",
                )
            if taken_over(job, fence):
                return "taken_over", f"Temporal silent {silent:.1f} s, the lease taken over"


def cut_off(fence: AttemptFence, outcome: str, detail: str, agent_id: str) -> None:
    """Log and count an attempt whose handler was stopped for `until_cut_off`'s `outcome`."""
    metrics.ATTEMPTS_CUT_OFF.labels(outcome).inc()
    log.warning(
        "Temporal stopped answering this worker and the job's lease is not known to be its "
        "own; handler stopped: %s",
        detail,
        extra={
            "event": "attempt.cut_off",
            "jobId": fence.job_id,
            "attempt": fence.attempt,
            "workerId": fence.worker_id,
            "agentId": agent_id,
            "outcome": outcome,
        },
    )
