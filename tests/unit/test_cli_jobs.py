"""`receipt jobs ls`, `receipt enqueue` and `receipt agent-jobs answer --wait` over httpx's mock
transport (the live api's answers are in tests/e2e/test_cli.py): the page cursor is sent and named,
`--all` follows it, an enqueue given two idempotency keys is a usage error before anything is
posted, a wait's exit status says how the agent job ended (an answered question is followed to
the status the job rests in next), agent-jobs usage errors exit 2 before anything is sent, and
`schedules create` sends its options and shows the last runs."""

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
from roles.cli import schedules as cli_schedules

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
    monkeypatch.setattr(cli_agent_jobs, "ApiClient", Mocked)
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


def transitioned(to: str) -> dict[str, Any]:
    return {"type": "agent_job.transitioned", "seq": 0, "data": {"to": to}}


def waited(
    monkeypatch: pytest.MonkeyPatch, views: list[dict[str, Any]], receipts: list[dict[str, Any]]
) -> tuple[int, list[dict[str, Any]], list[dict[str, Any]]]:
    """`_wait` over an API answering GET with `views` in turn and following `receipts`: its
    exit status, the view it printed, and the receipts it read."""
    read: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=views.pop(0) if len(views) > 1 else views[0])

    class Mocked(cli_client.ApiClient):
        def __init__(self) -> None:
            Client.__init__(self, "http://a", "", transport=httpx.MockTransport(answer))

        def follow_raw(self, *args: Any, **kwargs: Any) -> Any:
            for receipt in receipts:
                read.append(receipt)
                yield receipt

    printed: list[dict[str, Any]] = []
    monkeypatch.setattr(cli_agent_jobs, "_echo_view", lambda job, *_: printed.append(job))
    code = cli_agent_jobs._wait(Mocked(), "a-1", 5, as_json=True, quiet=False)
    return code, printed, read


def test_an_answered_question_is_followed_until_the_job_rests_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Waiting on a question already answered, the job is not resting: `--wait` follows it past
    `running` to the next status it rests in, and stops there."""
    asked = {"agentJobId": "a-1", "status": "waiting_on_user", "latestStatus": {"answered": True}}
    again = {"agentJobId": "a-1", "status": "waiting_on_user", "latestStatus": {}}
    later = [transitioned("queued"), transitioned("running"), transitioned("waiting_on_user")]
    code, printed, read = waited(monkeypatch, [asked, again], [*later, transitioned("succeeded")])
    assert code == 0 and printed == [again] and read == later
    ended = {"agentJobId": "a-1", "status": "stopped"}
    code, printed, read = waited(
        monkeypatch, [asked, ended], [transitioned("running"), transitioned("stopped")]
    )
    assert code == 1 and printed == [ended] and len(read) == 2


@pytest.mark.parametrize(
    ("command", "args", "says"),
    [
        (
            cli_agent_jobs.create_command,
            ["codex", "--session", "s", "--tool-call", "t", "--route", "b/c"],
            "exactly one",
        ),
        (
            cli_agent_jobs.create_command,
            ["codex", "--session", "s", "--tool-call", "t", "--prompt", "p", "--route", "b"],
            "BINDING",
        ),
        (cli_agent_jobs.ls_command, [], "give --session"),
        (cli_agent_jobs.ls_command, ["--session", "s", "--organization-id", "o"], "goes with"),
        (cli_agent_jobs.events_command, [], "give an agent job ID"),
        (cli_agent_jobs.events_command, ["a-1", "--session", "s"], "not both"),
    ],
)
def test_agent_jobs_usage_errors_exit_2_before_anything_is_sent(
    sent: list[httpx.Request], command: Any, args: list[str], says: str
) -> None:
    ran = CliRunner().invoke(command, [*args, "--api-url", "http://a"])
    assert ran.exit_code == 2 and says in ran.output and sent == [], ran.output


def test_schedules_create_sends_its_overlap_and_paused_and_shows_the_last_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    posted: list[dict[str, Any]] = []
    view = {"scheduleId": "s-1", "status": "paused", "intervalS": 60, "overlap": "allow"}
    view |= {"agentId": "codex", "fired": 2, "skipped": 1}
    view["lastRuns"] = [
        {"fireTime": "t1", "outcome": "enqueued", "jobId": "s-1:t1", "jobStatus": "completed"},
        {"fireTime": "t2", "outcome": "skipped", "runningJobId": "s-1:t1"},
    ]

    def answer(request: httpx.Request) -> httpx.Response:
        posted.append(json.loads(request.content))
        return httpx.Response(201, json=view)

    class Mocked(cli_client.ApiClient):
        def __init__(self, url: str, token: str | None) -> None:
            Client.__init__(self, url, token or "", transport=httpx.MockTransport(answer))

    monkeypatch.setattr(cli_schedules, "ApiClient", Mocked)
    given = ["--interval", "1m", "--agent", "codex", "--job", "{}", "--overlap", "allow"]
    ran = CliRunner().invoke(
        cli_schedules.schedules_create, [*given, "--paused", "--api-url", "http://a"]
    )
    assert ran.exit_code == 0, ran.output
    assert posted[0]["overlap"] == "allow" and posted[0]["paused"] is True
    assert "  t1  enqueued s-1:t1 completed" in ran.stdout
    assert "  t2  skipped  (skipped: s-1:t1 still active)" in ran.stdout
