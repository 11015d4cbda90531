"""deploy/grafana/receipt.json: every panel's query parses (each loaded as a recording rule and
checked by `promtool check rules`, which parses PromQL) and names only metrics the roles export
— receipts/metrics.py's families, the Temporal SDK's, `up` — except the Temporal server's
backlog gauge, which only a panel titled for the Temporal server may name. The provisioning
files name the dashboard's datasource."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.exported import exported_metric_names, names_in
from tests.deploy.test_prometheus_rules import promtool

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = json.loads((GRAFANA / "receipt.json").read_text())
# Metrics of the Temporal server (its matching service), not of any role: the task-queue backlog
# is only known there. A panel naming one says so in its title.
TEMPORAL_SERVER = {"approximate_backlog_count", "approximate_backlog_age_seconds"}
# Grafana's own variables, as Prometheus would see them once Grafana has substituted them.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel with queries, rows' nested panels included."""
    found: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        found += panels(panel) if panel.get("panels") else []
        if panel.get("targets"):
            found.append(panel)
    return found


def expressions() -> list[tuple[str, str]]:
    """(panel title, PromQL as Prometheus receives it) of every query."""
    out = []
    for panel in panels(DASHBOARD):
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, (panel["title"], expr)  # a variable the test cannot resolve
            out.append((panel["title"], expr))
    return out


def test_every_panel_query_parses(tmp_path: Path) -> None:
    queries = expressions()
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"receipt_dashboard:panel_{i}", "expr": expr}
                    for i, (_, expr) in enumerate(queries)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    ran = subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"SUCCESS: {len(queries)} rules found" in ran.stdout, ran.stdout


def test_every_panel_names_only_exported_metrics() -> None:
    exported = exported_metric_names()
    for title, expr in expressions():
        named = names_in(expr)
        assert named, (title, expr)  # a query that selects nothing we know
        server = named & TEMPORAL_SERVER
        if server:
            assert "Temporal server" in title, (title, sorted(server))
        assert not named - exported - TEMPORAL_SERVER, (title, sorted(named - exported))


def test_the_dashboard_covers_what_operators_watch() -> None:
    named = set().union(*(names_in(expr) for _, expr in expressions()))
    for needed in (
        "receipt_jobs_enqueued_total",  # throughput
        "receipt_jobs_finished_total",  # throughput, failures by agent
        "receipt_enqueue_to_start_seconds_bucket",  # latency percentiles
        "receipt_api_request_duration_seconds_bucket",
        "receipt_queue_depth",  # queue depth and age
        "receipt_queue_oldest_age_seconds",
        "receipt_role_ready",  # readiness
        "approximate_backlog_count",  # Temporal task-queue backlog (server)
        "temporal_activity_schedule_to_start_latency_bucket",  # and as the SDK sees it
    ):
        assert needed in named, needed
    failures = [e for t, e in expressions() if t == "Failure ratio by agent"]
    assert failures and all("by (agent)" in e and 'status="failed"' in e for e in failures)


def test_panels_use_the_provisioned_datasource_and_unique_ids() -> None:
    datasources = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "receipt.yaml").read_text()
    )["datasources"]
    (uid,) = [d["uid"] for d in datasources if d["type"] == "prometheus"]
    for panel in panels(DASHBOARD):
        assert panel["datasource"] == {"type": "prometheus", "uid": uid}, panel["title"]
        assert all(t["datasource"]["uid"] == uid for t in panel["targets"]), panel["title"]
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    providers = yaml.safe_load(
        (GRAFANA / "provisioning" / "dashboards" / "receipt.yaml").read_text()
    )["providers"]
    assert [p["type"] for p in providers] == ["file"]
    assert re.fullmatch(r"[a-z0-9-]+", DASHBOARD["uid"])
