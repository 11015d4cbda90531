"""A real Prometheus server (Debian's /usr/bin/prometheus) for the e2e tests: a scrape config for
the role processes, the alert rules loaded, and queries over its HTTP API."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from roles.infra.ports import free_port, wait_port
from roles.infra.supervisor import Supervised
from tests.eventually import eventually

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "receipt-rules.yaml"


def prometheus_binary() -> str:
    """The prometheus server; skips without it, fails without it in CI (.ci/run installs it)."""
    found = shutil.which("prometheus")
    if found:
        return found
    message = "prometheus is not installed (Debian: apt-get install prometheus; .ci/run does it)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def rules_with(overrides: Mapping[str, tuple[str, str, str]]) -> dict[str, Any]:
    """The rules file with, for each named alert, one threshold replaced and its `for:` set:
    `{alert: (old, new, for)}`. The expression is otherwise the shipped one; a threshold not
    found in it raises, so the test cannot drift from the file."""
    rules = yaml.safe_load(RULES.read_text())
    seen = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") in overrides:
                old, new, hold = overrides[rule["alert"]]
                assert old in rule["expr"], (rule["alert"], old, rule["expr"])
                rule["expr"] = rule["expr"].replace(old, new)
                rule["for"] = hold
                seen.add(rule["alert"])
    assert seen == set(overrides), set(overrides) - seen
    return dict(rules)


@dataclass
class Prometheus:
    """One Prometheus server process scraping `targets` ({job: host:port}) every second."""

    directory: Path
    targets: Mapping[str, str]
    rules: Mapping[str, Any]
    port: int = 0
    process: Supervised | None = None

    def config(self) -> dict[str, Any]:
        return {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(self.directory / "rules.yaml")],
            "scrape_configs": [
                {
                    "job_name": job,
                    "scrape_interval": "1s",
                    "scrape_timeout": "900ms",
                    "static_configs": [{"targets": [target]}],
                }
                for job, target in self.targets.items()
            ],
        }

    async def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "rules.yaml").write_text(yaml.safe_dump(dict(self.rules)))
        (self.directory / "prometheus.yml").write_text(yaml.safe_dump(self.config()))
        self.port = free_port()
        argv = [
            prometheus_binary(),
            f"--config.file={self.directory / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
            "--log.level=warn",
        ]
        self.process = Supervised(
            "prometheus", argv, dict(os.environ), log_file=self.directory / "prometheus.log"
        )
        started = self.process.start()
        await wait_port(self.port, 30, exited=started.poll, name="prometheus")
        # It listens before it is ready (storage and rules loading) and answers its API 503
        # meanwhile: a query then was a failed test on a loaded machine.
        await eventually(self._ready, timeout=30, every=0.1, what="prometheus ready (/-/ready)")

    async def _ready(self) -> bool:
        async with httpx.AsyncClient() as http:
            answer = await http.get(f"{self.url}/-/ready", timeout=5)
        return answer.status_code == 200

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` evaluates to now (the API's `data.result`)."""
        async with httpx.AsyncClient() as http:
            answer = await http.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5)
        body = answer.json()
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    async def alerts(self) -> list[dict[str, Any]]:
        """The alerts pending or firing now."""
        async with httpx.AsyncClient() as http:
            answer = await http.get(f"{self.url}/api/v1/alerts", timeout=5)
        return list(answer.json()["data"]["alerts"])

    def log(self) -> str:
        path = self.directory / "prometheus.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


def scalar(result: list[dict[str, Any]]) -> float | None:
    """The value of a one-element instant vector (None when empty)."""
    return float(result[0]["value"][1]) if result else None


def by_label(result: list[dict[str, Any]], label: str) -> dict[str, float]:
    """An instant vector as {value of `label`: sample value}."""
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in result}
