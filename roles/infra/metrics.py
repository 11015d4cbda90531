"""Prometheus metrics of every role: one set of families, hooks wired into the parts they observe."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from activities import driver as driver_activities
from activities import retry, sandbox
from activities.attempt import AttemptHooks
from activities.handlers import factory as factory_handlers
from activities.handlers import store as handler_store
from receipts import deliveries, fairness, reads
from receipts.jobs import ACTIVE_STATUSES, STATUSES, Job
from receipts.kinds import AGENT_IDS, route, route_disagrees
from receipts.objectives import control as objective_control
from receipts.objectives import store as objectives
from receipts.retention import PruneResult
from receipts.settings import Settings
from receipts.store import Store
from roles.delivery.loops import LoopHooks, PassResult
from roles.delivery.retention import RetentionHooks
from roles.delivery.starter import StarterHooks

log = logging.getLogger("roles.infra.metrics")

ACTIVE_ORDER = tuple(s for s in STATUSES if s in ACTIVE_STATUSES)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)


OTHER_AGENT = "other"


def agent_label(agent_id: str) -> str:
    """The `agent` label of an agent id: one of the four, else `other` (a tenant chooses agent
    ids, and each new label value is a new series on every scrape)."""
    return agent_id if agent_id in AGENT_IDS else OTHER_AGENT


class Metrics:
    """All metric families (created once per registry)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        r = registry
        self.enqueued = Counter(
            "receipt_jobs_enqueued",
            "Enqueue requests by outcome (created, existing, steered).",
            ["lane", "kind", "agent", "outcome"],
            registry=r,
        )
        self.idempotency_mismatches = Counter(
            "receipt_jobs_idempotency_mismatches",
            "Re-posts of an existing jobId with another agent or payload (the existing job is "
            "returned unchanged, flagged async.idempotencyMismatch).",
            ["agent"],
            registry=r,
        )
        self.settled = Counter(
            "receipt_jobs_settled",
            "Attempts settled, by job status and attempt result status.",
            ["status", "result_status"],
            registry=r,
        )
        self.attempts = Counter(
            "receipt_attempts_started",
            "Attempts that took a lease or a start-fence.",
            ["queue", "agent"],
            registry=r,
        )
        self.redeliveries = Counter(
            "receipt_attempt_redeliveries",
            "Attempts Temporal redelivered after losing their worker (start-fence takeovers).",
            ["queue", "agent"],
            registry=r,
        )
        self.lease_expirations = Counter(
            "receipt_lease_expirations",
            "job.lease_expired receipts appended by the scan.",
            registry=r,
        )
        self.redrives = Counter(
            "receipt_redrive_dispatches", "Queued-job redrive dispatches.", registry=r
        )
        self.starts = Counter(
            "receipt_driver_starts",
            "Driver starter outcomes (created, active_delivery, ...).",
            ["outcome"],
            registry=r,
        )
        self.active_delivery = Counter(
            "receipt_active_delivery_refusals",
            "Starts refused because a delivery is still open.",
            registry=r,
        )
        self.held_back = Counter(
            "receipt_jobs_held_back",
            "Starts held back because the job's organization held every dispatch slot it may "
            "on the worker queue (RECEIPT_ORG_MAX_RUNNING_PER_GROUP); the job stays queued.",
            ["queue"],
            registry=r,
        )
        self.waiting_for_slot = Gauge(
            "receipt_jobs_waiting_for_slot",
            "Queued, deliverable jobs held back for a dispatch slot of their organization now "
            "(read by worker-control with the queue depth).",
            registry=r,
        )
        self.generation_advances = Counter(
            "receipt_generation_advances", "Deliveries started at a generation above 0.", registry=r
        )
        self.heartbeat_lag = Histogram(
            "receipt_heartbeat_lag_seconds",
            "How late a heartbeat ran against its cadence.",
            buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1, 5),
            registry=r,
        )
        self.storage_retries = Counter(
            "receipt_settlement_retries", "Transient storage errors retried.", registry=r
        )
        self.handler_duration = Histogram(
            "receipt_handler_duration_seconds",
            "Handler run time by agent.",
            ["agent"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.enqueue_to_start = Histogram(
            "receipt_enqueue_to_start_seconds",
            "Database time from job.enqueued to its lease.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.enqueue_to_settle = Histogram(
            "receipt_enqueue_to_settle_seconds",
            "Database time from job.enqueued to its terminal receipt.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "receipt_queue_depth",
            "Active jobs by status (queued, leased, running; read from the projection by "
            "worker-control). Settled jobs: receipt_jobs_settled.",
            ["status"],
            registry=r,
        )
        self.route_disagreements = Counter(
            "receipt_route_contract_disagreements",
            "Enqueued jobs whose route and kind contract name different worker groups.",
            ["agent", "kind"],
            registry=r,
        )
        self.ledger_failures = Counter(
            "receipt_ledger_write_failures",
            "Best-effort ledger writes that failed.",
            ["table"],
            registry=r,
        )
        self.loop_pass = Histogram(
            "receipt_loop_pass_seconds",
            "Recovery loop pass durations.",
            ["loop"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.loop_slow = Counter(
            "receipt_loop_slow_passes",
            "Loop passes over their observational deadline.",
            ["loop"],
            registry=r,
        )
        self.retention_pruned = Counter(
            "receipt_retention_pruned_rows",
            "Rows the retention loop deleted, by table (jobs: terminal jobs pruned).",
            ["table"],
            registry=r,
        )
        self.retention_skipped = Counter(
            "receipt_retention_skipped_passes",
            "Retention passes skipped because another process held the single-flight lock.",
            registry=r,
        )
        self.factory_control_deliveries = Counter(
            "receipt_factory_control_deliveries",
            "Objective control requests handed to a control job, by enqueue outcome.",
            ["outcome"],
            registry=r,
        )
        self.factory_tasks_dispatched = Counter(
            "receipt_factory_tasks_dispatched",
            "Task tries dispatched by objective control.",
            registry=r,
        )
        self.factory_objectives_settled = Counter(
            "receipt_factory_objectives_settled",
            "Objectives settled by objective control, by status.",
            ["status"],
            registry=r,
        )
        self.factory_watchdog_fired = Counter(
            "receipt_factory_watchdog_fired",
            "Reconciles the objective watchdog requested, by reason.",
            ["reason"],
            registry=r,
        )
        self.sandbox_memory_kills = Counter(
            "receipt_sandbox_memory_kills",
            "Sandboxed commands the kernel killed at their cgroup's memory limit.",
            registry=r,
        )
        self.objective_writes_refused = Counter(
            "receipt_objective_writes_refused",
            "Objective writes (and monitor hand-offs) a handler asked for after its delivery lost "
            "the attempt's fence (nothing written), by the fence's refusal.",
            ["reason"],
            registry=r,
        )
        self.callbacks = Counter(
            "receipt_callbacks",
            "Callback posts by event and outcome (posted, or failed after its tries), per URL.",
            ["event", "outcome"],
            registry=r,
        )

    def retention_hooks(self) -> RetentionHooks:
        """Hooks for the retention loop."""

        def on_pruned(result: PruneResult) -> None:
            for table, rows in result.removed.items():
                self.retention_pruned.labels(table).inc(rows)

        return RetentionHooks(on_pruned=on_pruned, on_skipped=self.retention_skipped.inc)

    def job_enqueued(self, job: Job, outcome: str, idempotency_mismatch: bool = False) -> None:
        """Count an enqueue (and a route/contract disagreement when a job was created, a re-post
        with another agent or payload when it was one)."""
        self.enqueued.labels(job.lane, job.kind, agent_label(job.agent_id), outcome).inc()
        if idempotency_mismatch:
            self.idempotency_mismatches.labels(agent_label(job.agent_id)).inc()
        if outcome == "created" and route_disagrees(job.agent_id, job.kind):
            self.route_disagreements.labels(agent_label(job.agent_id), job.kind).inc()

    def attempt_hooks(self) -> AttemptHooks:
        """Hooks for the attempt activity."""

        def on_started(job: Job) -> None:
            self.attempts.labels(route(job.agent_id, job.kind), agent_label(job.agent_id)).inc()
            if job.lease is not None:
                self.enqueue_to_start.observe(
                    max(0.0, (job.lease.leased_at - job.created_at).total_seconds())
                )

        def on_settled(status: str, job: Job | None, handler_s: float | None) -> None:
            self.settled.labels(job.status if job else "", status).inc()
            if job is not None and job.settled_at is not None:
                self.enqueue_to_settle.observe(
                    max(0.0, (job.settled_at - job.created_at).total_seconds())
                )
            if job is not None and handler_s is not None:
                self.handler_duration.labels(agent_label(job.agent_id)).observe(handler_s)

        return AttemptHooks(
            on_started=on_started,
            on_settled=on_settled,
            on_heartbeat_lag=lambda lag: self.heartbeat_lag.observe(max(0.0, lag)),
            on_redelivered=lambda job: self.redeliveries.labels(
                route(job.agent_id, job.kind), job.agent_id
            ).inc(),
        )

    def starter_hooks(self) -> StarterHooks:
        """Hooks for the driver starter."""

        def on_start(outcome: str, generation: int | None) -> None:
            self.starts.labels(outcome).inc()
            if outcome == "active_delivery":
                self.active_delivery.inc()
            if outcome == "created" and generation:
                self.generation_advances.inc()

        return StarterHooks(
            on_start=on_start, on_held=lambda queue: self.held_back.labels(queue).inc()
        )

    def loop_hooks(self) -> LoopHooks:
        """Hooks for the recovery loops."""

        def on_redrive(result: PassResult) -> None:
            self.lease_expirations.inc(result.expired)
            self.redrives.inc(result.redriven)

        return LoopHooks(
            on_pass=lambda name, seconds: self.loop_pass.labels(name).observe(seconds),
            on_slow=lambda name: self.loop_slow.labels(name).inc(),
            on_redrive=on_redrive,
        )

    def wire_process_counters(self) -> None:
        """Count storage retries, ledger failures and the Factory's events of this process."""
        retry.on_retry.append(self.storage_retries.inc)
        deliveries.on_ledger_failure.append(lambda table: self.ledger_failures.labels(table).inc())
        objectives.on_control_delivered.append(
            lambda outcome: self.factory_control_deliveries.labels(outcome).inc()
        )
        objective_control.on_task_dispatched.append(self.factory_tasks_dispatched.inc)
        objective_control.on_objective_settled.append(
            lambda status: self.factory_objectives_settled.labels(status).inc()
        )
        factory_handlers.on_watchdog_fired.append(
            lambda reason: self.factory_watchdog_fired.labels(reason).inc()
        )
        sandbox.on_memory_limit.append(self.sandbox_memory_kills.inc)
        driver_activities.on_callback_result.append(
            lambda event, outcome: self.callbacks.labels(event, outcome).inc()
        )
        handler_store.on_objective_write_refused.append(
            lambda reason: self.objective_writes_refused.labels(reason).inc()
        )

    async def refresh_queue_depth(self, store: Store, settings: Settings | None = None) -> None:
        """Read active job counts by status from the projection into the gauge (a partial
        index: its cost follows the active jobs, not the history), and with `settings` how
        many of the queued ones wait for a dispatch slot."""
        counts = await reads.active_by_status(store)
        for status in ACTIVE_ORDER:
            self.queue_depth.labels(status).set(counts.get(status, 0))
        if settings is not None and counts.get("queued") and fairness.capped(settings):
            self.waiting_for_slot.set(await fairness.held_back(store, settings))
        elif settings is not None:
            self.waiting_for_slot.set(0)

    async def run_queue_depth(
        self, store: Store, settings: Settings, interval_s: float = 5.0
    ) -> None:
        """Refresh the queue-depth gauges until cancelled."""
        while True:
            with contextlib.suppress(Exception):
                await self.refresh_queue_depth(store, settings)
            await asyncio.sleep(interval_s)
