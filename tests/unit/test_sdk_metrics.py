"""The Temporal SDK's buffered updates as Prometheus families: counters add their deltas, gauges
keep the last value, histograms count observations into cumulative buckets in seconds."""

from __future__ import annotations

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
