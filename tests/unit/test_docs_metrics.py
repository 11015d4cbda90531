"""The docs name what the roles export: every metric family is named in a page of the docs, and
every `limit` the api counts a refusal under is listed where the docs and the family's help list
them (the docs audit of 2026-12-07)."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import Counter, Gauge, Histogram

from receipts import metrics
from receipts.agent_jobs import metrics as agent_job_metrics
from receipts.objectives import metrics as objective_metrics
from roles.infra import metrics as role_metrics

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def families() -> list[str]:
    modules = (metrics, agent_job_metrics, objective_metrics, role_metrics)
    return sorted(
        {
            family._name
            for module in modules
            for family in vars(module).values()
            if isinstance(family, Counter | Gauge | Histogram)
        }
    )


def test_every_metric_family_is_named_in_the_docs() -> None:
    text = "\n".join(page.read_text() for page in DOCS)
    unnamed = [name for name in families() if not re.search(rf"\b{name}(_total)?\b", text)]
    assert unnamed == []


def test_every_limit_the_api_counts_is_listed_in_the_readme_and_the_help() -> None:
    sources = [*(ROOT / "roles" / "api").rglob("*.py")]
    counted = {
        label
        for source in sources
        for label in re.findall(r"API_LIMITED\.labels\(\"(\w+)\"\)", source.read_text())
    }
    counted |= {"queued", "active"}  # roles/api/admission.py labels them by a variable
    listed = re.search(
        r"`receipt_api_limited_total\{limit\}` \(([^)]*)\)", (ROOT / "README.md").read_text()
    )
    assert listed is not None
    readme = {word.strip() for word in listed.group(1).split(",")}
    assert counted - readme == set()
    assert [
        label for label in sorted(counted) if label not in metrics.API_LIMITED._documentation
    ] == []
