"""The Temporal SDK's buffered updates as Prometheus families: counters add their deltas, gauges
keep the last value, histograms count observations into cumulative buckets in seconds."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from temporalio.runtime import (
    BUFFERED_METRIC_KIND_COUNTER,
    BUFFERED_METRIC_KIND_GAUGE,
    BUFFERED_METRIC_KIND_HISTOGRAM,
)

from roles.infra.sdk_metrics import SdkMetrics

QUEUE = {"namespace": "default", "task_queue": "receipt-chat"}


def exposition(collector: SdkMetrics) -> list[str]:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(collector)
    return generate_latest(registry).decode().splitlines()


def test_counters_gauges_and_histograms_as_prometheus_reads_them() -> None:
    collector = SdkMetrics()
    fold = collector._fold  # what drain() does with each buffered update
    fold("temporal_request", "Requests", BUFFERED_METRIC_KIND_COUNTER, {"operation": "Poll"}, 2)
    fold("temporal_request", "Requests", BUFFERED_METRIC_KIND_COUNTER, {"operation": "Poll"}, 3)
    fold("temporal_num_pollers", "Pollers", BUFFERED_METRIC_KIND_GAUGE, QUEUE, 5)
    fold("temporal_num_pollers", "Pollers", BUFFERED_METRIC_KIND_GAUGE, QUEUE, 2)
    for seconds in (0.003, 0.04, 7.0):
        fold("temporal_x_latency", "Latency", BUFFERED_METRIC_KIND_HISTOGRAM, QUEUE, seconds)
    lines = exposition(collector)
    assert 'temporal_request_total{operation="Poll"} 5.0' in lines
    assert "# TYPE temporal_request_total counter" in lines
    assert 'temporal_num_pollers{namespace="default",task_queue="receipt-chat"} 2.0' in lines
    bucket = 'temporal_x_latency_bucket{le="%s",namespace="default",task_queue="receipt-chat"} %s'
    assert bucket % ("0.001", "0.0") in lines
    assert bucket % ("0.005", "1.0") in lines
    assert bucket % ("0.05", "2.0") in lines
    assert bucket % ("5.0", "2.0") in lines
    assert bucket % ("10.0", "3.0") in lines
    assert bucket % ("+Inf", "3.0") in lines
    assert 'temporal_x_latency_count{namespace="default",task_queue="receipt-chat"} 3.0' in lines
    assert 'temporal_x_latency_sum{namespace="default",task_queue="receipt-chat"} 7.043' in lines


def test_a_failed_drain_is_logged_as_an_event_and_counted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The drainer thread outlives a failed drain, but logged it with no event and counted
    nothing: drains that kept failing froze every `temporal_*` family (ReceiptTemporalUnreachable
    reads them) and filled the SDK's buffers, and no alert could say so. A WARNING, as every
    loop's failed pass (it was ERROR here alone: the next tick tries again)."""
    from receipts import metrics
    from roles.infra import sdk_metrics

    class OneTick:
        """The drainer's stop event: one interval passes, then it is set."""

        def __init__(self) -> None:
            self.ticks = 0

        def wait(self, _: float) -> bool:
            self.ticks += 1
            return self.ticks > 1

    def broken() -> None:
        raise ValueError("a buffered update the fold cannot read")

    collector = SdkMetrics()
    monkeypatch.setattr(sdk_metrics.threading, "Event", OneTick)
    monkeypatch.setattr(collector, "drain", broken)
    loop = "temporal_sdk_metrics"
    before = metrics.value("receipt_loop_failed_passes_total", loop=loop)
    collector._drain_forever()
    assert metrics.value("receipt_loop_failed_passes_total", loop=loop) == before + 1
    failed = [r for r in caplog.records if getattr(r, "event", None) == "loop.failed"]
    assert len(failed) == 1 and getattr(failed[0], "loop", None) == loop
    assert failed[0].levelno == logging.WARNING and failed[0].exc_info is not None
