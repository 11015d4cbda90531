"""The Temporal SDK's metrics on the role's one `/metrics`: its runtime's buffer, exported through
prometheus_client's default registry beside receipts/metrics.py's families.

The SDK's own Prometheus exporter binds a port of its own; instead each Temporal runtime a
process creates records into a `MetricBuffer`, and one collector on the default registry
drains every buffer (at each scrape, and every `DRAIN_INTERVAL_S` on a daemon thread so the
buffer never fills between scrapes) and keeps the running values: counters as `<name>_total`,
gauges as their last value, histograms (durations in seconds) as `<name>_bucket/_sum/_count`
over `BUCKETS`. Names keep the SDK's (`temporal_request`, `temporal_workflow_task_schedule_to_start_latency`,
…); labels are the SDK's attributes (namespace, task queue, workflow and activity type,
operation: values from our own code and configuration, never a tenant's).
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import REGISTRY
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from temporalio.runtime import (
    BUFFERED_METRIC_KIND_COUNTER,
    BUFFERED_METRIC_KIND_GAUGE,
    MetricBuffer,
    MetricBufferDurationFormat,
)

from receipts import metrics

log = logging.getLogger("roles.infra.sdk_metrics")

# Large, as the SDK asks: updates past it are dropped (and logged by the core).
BUFFER_SIZE = 100_000
DRAIN_INTERVAL_S = 1.0
DRAIN_LOOP = "temporal_sdk_metrics"  # the `loop` label of a failed drain
BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

Labels = tuple[tuple[str, str], ...]

# The families the SDK records (its core's metric names and kinds; Temporal's "SDK metrics"
# reference). The exporter passes on whatever the SDK records; this list is what the dashboard
# and the alert rules may name, and the role tests hold every family a real worker exports to it.
SDK_FAMILIES: dict[str, str] = {
    **dict.fromkeys(
        (
            "temporal_request",
            "temporal_request_failure",
            "temporal_long_request",
            "temporal_long_request_failure",
            "temporal_worker_start",
            "temporal_workflow_completed",
            "temporal_workflow_failed",
            "temporal_workflow_canceled",
            "temporal_workflow_continue_as_new",
            "temporal_workflow_task_queue_poll_succeed",
            "temporal_workflow_task_queue_poll_empty",
            "temporal_workflow_task_execution_failed",
            "temporal_activity_task_received",
            "temporal_activity_poll_no_task",
            "temporal_activity_execution_failed",
            "temporal_activity_execution_cancelled",
            "temporal_local_activity_total",
            "temporal_local_activity_execution_failed",
            "temporal_local_activity_execution_cancelled",
            "temporal_sticky_cache_hit",
            "temporal_sticky_cache_miss",
            "temporal_sticky_cache_total_forced_eviction",
            "temporal_corrupted_signals",
            "temporal_nexus_task_execution_failed",
            "temporal_nexus_poll_no_task",
        ),
        "counter",
    ),
    **dict.fromkeys(
        (
            "temporal_num_pollers",
            "temporal_worker_task_slots_available",
            "temporal_worker_task_slots_used",
            "temporal_sticky_cache_size",
        ),
        "gauge",
    ),
    **dict.fromkeys(
        (
            "temporal_request_latency",
            "temporal_long_request_latency",
            "temporal_workflow_endtoend_latency",
            "temporal_workflow_task_schedule_to_start_latency",
            "temporal_workflow_task_execution_latency",
            "temporal_workflow_task_replay_latency",
            "temporal_activity_schedule_to_start_latency",
            "temporal_activity_execution_latency",
            "temporal_activity_succeed_endtoend_latency",
            "temporal_local_activity_execution_latency",
            "temporal_local_activity_succeed_endtoend_latency",
            "temporal_nexus_task_schedule_to_start_latency",
            "temporal_nexus_task_execution_latency",
            "temporal_nexus_task_endtoend_latency",
        ),
        "histogram",
    ),
}


@dataclass
class _Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    total: float = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, value)] += 1
        self.total += value


@dataclass
class _Family:
    kind: str  # counter, gauge or histogram
    documentation: str
    values: dict[Labels, float] = field(default_factory=dict)
    histograms: dict[Labels, _Histogram] = field(default_factory=dict)


class SdkMetrics(Collector):
    """Every Temporal runtime's buffered metrics of this process, as Prometheus families."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buffers: list[MetricBuffer] = []
        self._families: dict[str, _Family] = {}
        self._drainer: threading.Thread | None = None

    def buffer(self) -> MetricBuffer:
        """A new buffer for a Temporal runtime to record into; this collector drains it."""
        created = MetricBuffer(BUFFER_SIZE, MetricBufferDurationFormat.SECONDS)
        with self._lock:
            self._buffers.append(created)
            if self._drainer is None:
                self._drainer = threading.Thread(
                    target=self._drain_forever, name="temporal-sdk-metrics", daemon=True
                )
                self._drainer.start()
        return created

    def drain(self) -> None:
        """Fold every buffer's updates into the running values."""
        with self._lock:
            for buffer in self._buffers:
                try:
                    updates = buffer.retrieve_updates()
                except RuntimeError:  # its runtime is not created yet
                    continue
                for update in updates:
                    metric = update.metric
                    self._fold(
                        metric.name,
                        metric.description,
                        metric.kind,
                        update.attributes,
                        update.value,
                    )

    def _fold(
        self,
        name: str,
        documentation: str | None,
        kind: int,
        attributes: Mapping[str, object],
        value: float,
    ) -> None:
        labels: Labels = tuple(sorted((str(k), str(v)) for k, v in attributes.items()))
        if kind == BUFFERED_METRIC_KIND_COUNTER:
            family = self._family(name, "counter", documentation)
            family.values[labels] = family.values.get(labels, 0.0) + value
        elif kind == BUFFERED_METRIC_KIND_GAUGE:
            self._family(name, "gauge", documentation).values[labels] = value
        else:
            histograms = self._family(name, "histogram", documentation).histograms
            histograms.setdefault(labels, _Histogram()).observe(value)

    def _family(self, name: str, kind: str, documentation: str | None) -> _Family:
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = _Family(kind, documentation or name)
        return family

    def _drain_forever(self) -> None:
        stop = threading.Event()
        metrics.LOOP_FAILED.labels(DRAIN_LOOP)  # from 0: an alert's increase() sees the first
        while not stop.wait(DRAIN_INTERVAL_S):
            try:
                self.drain()
            except Exception as exc:  # a failed drain must not end the thread: the next retries
                # Drains that keep failing freeze every temporal_* family (an alert reads them)
                # and fill the SDK's buffers: ReceiptRecoveryLoopFailing says so.
                metrics.LOOP_FAILED.labels(DRAIN_LOOP).inc()
                log.warning(  # as every loop's failed pass: the next tick tries again
                    "temporal SDK metrics drain failed",
                    exc_info=True,
                    extra={"event": "loop.failed", "loop": DRAIN_LOOP, "error": str(exc)},
                )

    def collect(self) -> Iterator[Metric]:
        """The families as they stand after draining every buffer."""
        self.drain()
        exported: list[Metric] = []
        with self._lock:
            for name, family in self._families.items():
                metric = Metric(name, family.documentation, family.kind)
                if family.kind == "counter":
                    for labels, total in family.values.items():
                        metric.add_sample(f"{name}_total", dict(labels), total)
                elif family.kind == "gauge":
                    for labels, current in family.values.items():
                        metric.add_sample(name, dict(labels), current)
                else:
                    for labels, histogram in family.histograms.items():
                        _add_histogram(metric, name, dict(labels), histogram)
                exported.append(metric)
        return iter(exported)

    def describe(self) -> list[Metric]:
        """Nothing up front: the SDK names its families as it records them."""
        return []


def _add_histogram(metric: Metric, name: str, labels: dict[str, str], h: _Histogram) -> None:
    running = 0
    for bound, count in zip((*BUCKETS, float("inf")), h.counts, strict=True):
        running += count
        le = "+Inf" if bound == float("inf") else repr(float(bound))
        metric.add_sample(f"{name}_bucket", {**labels, "le": le}, running)
    metric.add_sample(f"{name}_count", labels, running)
    metric.add_sample(f"{name}_sum", labels, h.total)


SDK_METRICS = SdkMetrics()
REGISTRY.register(SDK_METRICS)
