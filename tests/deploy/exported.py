"""The sample names the roles export, for the checks that the alert rules and the dashboard name
only real metrics: every family of the default registry (receipts/metrics.py's, the process
and platform collectors') and the Temporal SDK's (roles/infra/sdk_metrics.py), each with the
suffixes its type adds, and `up`, which Prometheus writes for every scrape."""

from __future__ import annotations

import re

from prometheus_client import REGISTRY

import receipts.agent_jobs.metrics
import receipts.metrics
import receipts.objectives.metrics  # noqa: F401
from roles.infra.sdk_metrics import SDK_FAMILIES

SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
}
SCRAPE_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
# PromQL words that look like metric names in an expression: functions, aggregations, keywords.
WORDS = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def exported_metric_names() -> set[str]:
    """Every sample name a role's /metrics can carry, and Prometheus' own per-scrape series."""
    names = set(SCRAPE_SERIES)
    for family in REGISTRY.collect():
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    for name, kind in SDK_FAMILIES.items():
        names.update(name + suffix for suffix in SUFFIXES[kind])
    return names


def names_in(expr: str) -> set[str]:
    """The metric names an expression selects: the words that start a selector, i.e. a word
    followed by `{`, `[`, or standing alone, minus label names, functions and keywords — we
    take the `receipt_`, `temporal_`, `process_` and scrape names, which is every family the
    roles export."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    without_labels = re.sub(r"\{[^}]*\}", "{}", without_strings)
    without_groupings = re.sub(
        r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", without_labels
    )
    return {
        word
        for word in WORDS.findall(without_groupings)
        if word.startswith(("receipt_", "temporal_", "process_", "python_", "approximate_"))
        or word in SCRAPE_SERIES
    }
