"""`receipt jobs ls`, `receipt enqueue` and `receipt agent-jobs answer --wait` over httpx's mock
transport (the live api's answers are in tests/e2e/test_cli.py): the page cursor is sent and named,
`--all` follows it, an enqueue given two idempotency keys is a usage error before anything is
posted, and a wait's exit status says how the agent job ended."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from receipt_client import Client
from roles.cli import agent_jobs as cli_agent_jobs
from roles.cli import client as cli_client
from roles.cli import jobs as cli_jobs

PAGES = {None: ("job-1", "c-1"), "c-1": ("job-2", "c-2"), "c-2": ("job-3", None)}


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[httpx.Request]:
    """The requests the CLI sends to an API of three one-job pages of `GET /jobs`."""
    requests: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        job_id, cursor = PAGES[request.url.params.get("cursor")]
        job: dict[str, Any] = {"jobId": job_id, "agentId": "codex", "kind": "factory.task.run"}
        job |= {"status": "queued", "attempt": 0, "maxAttempts": 2, "createdAt": "now"}
        return httpx.Response(200, json={"jobs": [job], "nextCursor": cursor})

    class Mocked(cli_client.ApiClient):
        def __init__(self, url: str, token: str | None) -> None:
            Client.__init__(self, url, token or "", transport=httpx.MockTransport(answer))

    monkeypatch.setattr(cli_jobs, "ApiClient", Mocked)
    return requests


def listed(*args: str) -> tuple[list[str], str]:
    ran = CliRunner().invoke(cli_jobs.jobs_ls, [*args, "--json", "--api-url", "http://a"])
    assert ran.exit_code == 0, ran.output
    return [json.loads(line)["jobId"] for line in ran.stdout.splitlines()], ran.stderr


def test_jobs_ls_shows_one_page_and_names_the_next_cursor(sent: list[httpx.Request]) -> None:
    ran = CliRunner().invoke(cli_jobs.jobs_ls, ["--limit", "1", "--api-url", "http://a"])
    assert ran.exit_code == 0 and "job-1" in ran.stdout and "job-2" not in ran.stdout
    assert ran.stderr.strip() == "more: --cursor c-1" and len(sent) == 1
    assert listed("--cursor", "c-1") == (["job-2"], "")
    assert sent[-1].url.params["cursor"] == "c-1"


def test_jobs_ls_all_follows_the_cursor_through_every_page(sent: list[httpx.Request]) -> None:
    assert listed("--all", "--limit", "1") == (["job-1", "job-2", "job-3"], "")
    assert [r.url.params.get("cursor") for r in sent] == [None, "c-1", "c-2"]


def test_enqueue_refuses_a_job_id_with_an_idempotency_key(sent: list[httpx.Request]) -> None:
    given = ["codex", "--kind", "factory.task.run", "--job-id", "j-1", "--idempotency-key", "k"]
    ran = CliRunner().invoke(cli_jobs.enqueue_command, [*given, "--api-url", "http://a"])
    assert ran.exit_code == 2 and "not both" in ran.output and sent == []


@pytest.mark.parametrize(("status", "exit_code"), [("succeeded", 0), ("failed", 1), ("stopped", 1)])
def test_agent_jobs_answer_wait_exits_0_only_if_the_job_waits_or_succeeded(
    monkeypatch: pytest.MonkeyPatch, status: str, exit_code: int
) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            job = {"agentJobId": "a-1", "status": "queued", "seq": 5}
            return httpx.Response(202, json={"agentJob": job})
        return httpx.Response(200, json={"agentJobId": "a-1", "status": status, "seq": 6})

    class Mocked(cli_client.ApiClient):
        def __init__(self, url: str, token: str | None) -> None:
            Client.__init__(self, url, token or "", transport=httpx.MockTransport(answer))

    monkeypatch.setattr(cli_agent_jobs, "ApiClient", Mocked)
    given = ["a-1", "yes", "--wait", "--json", "--api-url", "http://a"]
    ran = CliRunner().invoke(cli_agent_jobs.answer_command, given)
    assert ran.exit_code == exit_code, ran.output
    assert json.loads(ran.stdout)["status"] == status
