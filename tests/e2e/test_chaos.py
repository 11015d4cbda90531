"""A short, seeded chaos smoke in `make test` (20 s of load, each fault kind once): every
invariant must keep holding. The soak itself is `make chaos` (600 s)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def test_a_short_seeded_chaos_smoke_keeps_every_invariant(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECEIPT_", "PYTEST"))}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.chaos",
            "--part",
            "soak",
            "--duration",
            "20",
            "--rate",
            "2",
            "--seed",
            "11",
            "--per-kind",
            "1",
            "--drain-timeout",
            "200",
            "--keep",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    summary = next(line for line in run.stdout.splitlines() if line.startswith("chaos: "))
    assert summary.endswith("lost 0, duplicate settlements 0, stuck 0"), summary
    assert "FAIL" not in run.stdout
    for kind in (
        "kill_worker",
        "kill_driver",
        "kill_driver_claim",
        "kill_api",
        "stop_worker",
        "restart_postgres",
        "restart_temporal",
    ):
        assert kind in run.stdout
    assert (tmp_path / "chaos.json").exists()
    # The agent-job layer ran under the same faults, and its invariants were checked.
    agent_jobs = re.search(r"agent jobs: (\d+) \(final", run.stdout)
    assert agent_jobs is not None and int(agent_jobs.group(1)) > 0, run.stdout[-3000:]
    for invariant in ("more than three running per agent: 0", "wakeups missing or doubled: 0"):
        assert f"ok   {invariant}" in run.stdout
