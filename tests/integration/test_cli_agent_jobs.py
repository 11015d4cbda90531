"""`receipt agent-jobs` as a real subprocess against a real `receipt api` process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.api_support import (
    ROOT,
    TOKEN_A,
    TOKEN_ADMIN,
    TOKEN_B,
    RunningApi,
    clean_env,
    receipt_cli,
    running_api,
)


@pytest.fixture(scope="module")
def api(db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    with running_api(db_url, Path(tmp_path_factory.mktemp("api"))) as api:
        yield api


def receipt(api: RunningApi, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    return receipt_cli(api, token, "agent-jobs", *args)


def test_create_list_get_events_answer_cancel(api: RunningApi) -> None:
    session = f"session-{uuid.uuid4().hex[:8]}"
    created = receipt(
        api,
        TOKEN_A,
        "create",
        "writer",
        "--session",
        session,
        "--tool-call",
        "tc-1",
        "--route",
        "slack/C1/T1",
        "--prompt",
        "write the notes",
        "--json",
    )
    assert created.returncode == 0, created.stderr
    job = json.loads(created.stdout)["agentJob"]
    agent_job_id = job["agentJobId"]
    assert job["replyRoute"] == {"binding": "slack", "channel": "C1", "thread": "T1"}

    listed = receipt(api, TOKEN_A, "ls", "--session", session)
    assert listed.returncode == 0 and agent_job_id in listed.stdout and "queued" in listed.stdout
    shown = receipt(api, TOKEN_A, "get", agent_job_id)
    assert shown.returncode == 0 and f"session   {session}" in shown.stdout
    events = receipt(api, TOKEN_A, "events", agent_job_id, "--json")
    assert [json.loads(line)["type"] for line in events.stdout.splitlines()] == [
        "agent_job.created"
    ]
    not_waiting = receipt(api, TOKEN_A, "answer", agent_job_id, "yes")
    assert not_waiting.returncode == 3 and "not_waiting" in not_waiting.stderr
    foreign = receipt(api, TOKEN_B, "cancel", agent_job_id)  # another organization's
    assert foreign.returncode == 3 and "404 not_found" in foreign.stderr
    stopped = receipt(api, TOKEN_A, "cancel", agent_job_id, "--reason", "not needed")
    assert stopped.returncode == 0 and f"stopped {agent_job_id}" in stopped.stdout
    again = receipt(api, TOKEN_ADMIN, "cancel", agent_job_id)
    assert again.returncode == 3 and "terminal_state" in again.stderr
    wakeups = receipt(api, TOKEN_A, "events", "--session", session)
    assert wakeups.returncode == 0 and wakeups.stdout == ""  # stopped wakes nobody


def test_events_follow_outlives_the_stream_lifetime_and_ends_with_the_job(
    db_url: str, tmp_path: Path
) -> None:
    # Streams end after 1 s here: the CLI resumes with Last-Event-ID until the job's `end`.
    with running_api(db_url, tmp_path, RECEIPT_SSE_MAX_LIFETIME_S="1") as short:
        session = f"session-{uuid.uuid4().hex[:8]}"
        created = receipt(
            short,
            TOKEN_A,
            *("create", "writer", "--session", session, "--tool-call", "tc-1"),
            *("--route", "slack/C1", "--prompt", "write the notes", "--json"),
        )
        assert created.returncode == 0, created.stderr
        agent_job_id = json.loads(created.stdout)["agentJob"]["agentJobId"]
        follower = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "roles.cli.main",
                "agent-jobs",
                "events",
                agent_job_id,
                "--follow",
            ],
            cwd=ROOT,
            env=clean_env({"RECEIPT_API_URL": short.url, "RECEIPT_API_TOKEN": TOKEN_A}),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            time.sleep(3.5)  # three lifetimes
            assert follower.poll() is None, follower.communicate()
            stopped = receipt(short, TOKEN_ADMIN, "cancel", agent_job_id)
            assert stopped.returncode == 0, stopped.stderr
            out, err = follower.communicate(timeout=30)
        finally:
            follower.kill()
    assert follower.returncode == 0, err
    # One line per receipt, each once and in order: created, then the stop.
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == [str(n) for n in range(1, len(lines) + 1)]
    assert "agent_job.created" in lines[0] and "stopped" in lines[-1]
