"""The settings layer from the outside: `receipt config`, a role refusing a bad value at start,
and `receipt api` running the api role itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from receipts.store import Store
from tests.integration.api_support import AS_A, clean_env, enqueue_body, rid, running_api

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def run(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *argv],
        cwd=ROOT,
        env=clean_env(env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_receipt_config_prints_the_effective_settings_with_secrets_masked() -> None:
    done = run(
        ["roles.cli.main", "config"],
        RECEIPT_DATABASE_URL="postgresql://app:hunter2@db.internal:5432/receipt",
        RECEIPT_API_TOKENS="t0ken-0123456789abcdef org-a",
        JOB_LEASE_MS="45000",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "JOB_LEASE_MS=45000" in lines
    assert "CODEX_JOB_LEASE_MS=900000  (default)" in lines
    assert "RECEIPT_API_TOKENS=***" in lines
    assert "hunter2" not in done.stdout and "t0ken" not in done.stdout
    assert any(line.startswith("RECEIPT_DATABASE_URL=") and "***" in line for line in lines)
    for title in ("# api", "# role process", "# recovery loops", "# objective watchdog"):
        assert title in lines


def test_a_bad_value_stops_config_and_a_role_at_once_naming_the_variable() -> None:
    config = run(["roles.cli.main", "config"], RECEIPT_METRICS_PORT="ninety")
    assert config.returncode == 2
    assert "RECEIPT_METRICS_PORT must be a port number" in config.stderr
    role = run(["roles.role"], RECEIPT_PROCESS_ROLE="driver", RECEIPT_SHUTDOWN_GRACE_MS="soon")
    assert role.returncode == 2
    assert (
        "receipt: bad configuration: RECEIPT_SHUTDOWN_GRACE_MS must be a whole number of "
        "milliseconds (0 or more), got 'soon'" in role.stderr
    )
    assert "Traceback" not in role.stderr
    loop = run(["roles.role"], RECEIPT_EVENT_LOOP="trio")  # the role itself from the environment
    assert loop.returncode == 2 and "Traceback" not in loop.stderr
    assert "RECEIPT_EVENT_LOOP must be 'uvloop' or 'asyncio', got 'trio'" in loop.stderr
    up = run(["roles.cli.main", "up"], RECEIPT_EVENT_LOOP="trio")
    assert up.returncode == 2
    assert "RECEIPT_EVENT_LOOP must be 'uvloop' or 'asyncio', got 'trio'" in up.stderr


def test_bad_api_tokens_stop_the_api_role_and_receipt_api_with_one_line() -> None:
    """A malformed RECEIPT_API_TOKENS (or none on a non-loopback bind) stopped `receipt role
    api` with a traceback and `receipt api` with exit 1: exit 2 and one line, as any setting."""
    for argv, env in (
        (["roles.role", "api"], {"RECEIPT_API_TOKENS": "garbage"}),
        (["roles.cli.main", "api"], {"RECEIPT_API_TOKENS": "garbage"}),
        (["roles.cli.main", "api", "--host", "0.0.0.0"], {}),
    ):
        done = run(argv, **env)
        assert done.returncode == 2, (argv, done.stderr)
        assert done.stderr.startswith("receipt: bad configuration: "), (argv, done.stderr)
        assert "Traceback" not in done.stderr


async def test_receipt_api_is_the_api_role_with_its_tracing(
    db_url: str, store: Store, tmp_path: Path
) -> None:
    with running_api(db_url, tmp_path) as api:
        async with httpx.AsyncClient(base_url=api.url, headers=AS_A) as http:
            response = await http.post("/agents/codex/jobs", json=enqueue_body())
        assert response.status_code == 202, response.text
        job_id = response.json()["async"]["jobId"]
        log = api.log_text()
    enqueued = (await store.read_stream(f"jobs/{rid(job_id)}"))[0]
    assert enqueued.type == "job.enqueued"
    assert len(enqueued.data["traceId"]) == 32  # the role's tracer provider made one
    assert '"event": "role.start"' in log and '"role": "api"' in log
