"""The alert rules as code: deploy/prometheus/receipt-rules.yaml passes `promtool check rules` and
its unit tests (`promtool test rules`, receipt-rules.test.yaml), deploy/k8s/monitoring's
PrometheusRule carries exactly its groups, and every metric a rule names is one the roles export.

promtool is Debian's `prometheus` package (.ci/run installs it). Without it these tests skip
with the reason, except in CI (`CI` set), where a missing promtool fails: a check that silently
did not run is no check.

`python -m tests.deploy.test_prometheus_rules` rewrites the PrometheusRule from the rules file.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.exported import exported_metric_names, names_in
from tests.deploy.render import render

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "receipt-rules.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "receipt-rules.test.yaml"
MONITORING = ROOT / "deploy" / "k8s" / "monitoring"
PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"
HEADER = """\
# Generated from deploy/prometheus/receipt-rules.yaml by
# `python -m tests.deploy.test_prometheus_rules`; tests/deploy/test_prometheus_rules.py fails
# while the two differ. Edit the rules file, then regenerate.
"""


def promtool() -> str:
    """The promtool binary; skips without it, fails without it in CI."""
    found = shutil.which("promtool")
    if found:
        return found
    message = "promtool is not installed (Debian: apt-get install prometheus; .ci/run does it)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def prometheus_rule() -> dict[str, Any]:
    """The PrometheusRule object carrying the rules file's groups."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "receipt",
            "labels": {
                "app.kubernetes.io/name": "receipt",
                "app.kubernetes.io/part-of": "receipt",
                "app.kubernetes.io/component": "monitoring",
            },
        },
        "spec": yaml.safe_load(RULES.read_text()),
    }


def _block_strings(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the longer expressions) as YAML blocks, as the rules file has them."""


_Dumper.add_representer(str, _block_strings)


def write_prometheus_rule() -> None:
    text = yaml.dump(prometheus_rule(), Dumper=_Dumper, sort_keys=False, width=200)
    PROMETHEUS_RULE.write_text(HEADER + text)


def test_the_rules_pass_promtool_check() -> None:
    ran = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert re.search(r"SUCCESS: \d+ rules found", ran.stdout), ran.stdout


def test_the_rules_pass_their_unit_tests() -> None:
    ran = subprocess.run(
        [promtool(), "test", "rules", str(RULE_TESTS)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=RULE_TESTS.parent,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_every_alert_the_operator_needs_is_unit_tested() -> None:
    """Each alert of the list the rules promise has a unit test that expects it to fire."""
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    promised = {
        "ReceiptJobsStuckQueued",  # jobs stuck queued past 15 minutes
        "ReceiptQueuedAgeHigh",  # the oldest queued job's age
        "ReceiptAgentFailureRatioHigh",  # failure ratio by agent
        "ReceiptRoleNotReady",  # a role not ready
        "ReceiptOutboxRedriveSlow",  # the outbox falling behind
        "ReceiptRedriveBusy",  # the redrive working hard
        "ReceiptRecoveryLoopFailing",
        "ReceiptRetentionFailing",
        "ReceiptTemporalUnreachable",
        "ReceiptQueueStuck",
        "ReceiptFileDescriptorsHigh",  # a handler leaking a descriptor per run
        "ReceiptFileDescriptorsExhausted",
    }
    assert promised <= fired, sorted(promised - fired)
    declared = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    assert fired <= declared
    # Every alert declared fires in a test (six never did), and docs/operations.md says what it
    # means and what to read when it fires.
    assert declared <= fired, sorted(declared - fired)
    operations = (ROOT / "docs" / "operations.md").read_text()
    undocumented = sorted(a for a in declared if f"`{a}`" not in operations)
    assert not undocumented, f"alerts docs/operations.md does not describe: {undocumented}"


def test_the_prometheus_rule_carries_the_same_rules() -> None:
    objects = render(MONITORING)
    assert [o["kind"] for o in objects] == ["PrometheusRule", "PodMonitor"]
    assert objects[0] == prometheus_rule(), (
        "deploy/k8s/monitoring/prometheusrule.yaml differs from deploy/prometheus/"
        "receipt-rules.yaml: run `.venv/bin/python -m tests.deploy.test_prometheus_rules`"
    )
    # The PodMonitor names the job as the rules expect it (`receipt-<role>`), from every pod's
    # `metrics` port (tests/deploy/test_manifests.py holds each role's).
    (endpoint,) = objects[1]["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics"
    (job,) = [r for r in endpoint["relabelings"] if r["targetLabel"] == "job"]
    assert job["sourceLabels"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_component"]
    assert job["replacement"] == "receipt-$1"
    assert objects[1]["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/part-of": "receipt"}
    # Kept out of the base: the base must render and apply without the Operator's CRD.
    base = (ROOT / "deploy" / "k8s" / "base" / "kustomization.yaml").read_text()
    assert "monitoring" not in base


def test_every_metric_a_rule_names_is_exported() -> None:
    exported = exported_metric_names()
    groups = yaml.safe_load(RULES.read_text())["groups"]
    for rule in (r for g in groups for r in g["rules"]):
        unknown = names_in(rule["expr"]) - exported
        assert not unknown, (rule["alert"], sorted(unknown))


if __name__ == "__main__":
    write_prometheus_rule()
    sys.stdout.write(f"wrote {PROMETHEUS_RULE.relative_to(ROOT)}\n")
