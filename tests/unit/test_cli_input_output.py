"""The `receipt` CLI's edges (a CLI audit): Ctrl-C during a wait or a follow exits 130 without a
traceback (not 1, which says the job failed); a hostile tenant's control characters and ANSI
escapes in ids, errors and output are shown escaped, never sent raw to the terminal; JSON that
the API cannot carry (NaN, a YAML date, a file that is not UTF-8) is a usage error naming the
option, exit 2, before anything is sent; and `jobs ls` prints nothing on stdout when the API
refuses it."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from receipt_client import Client
from roles.cli import client as cli_client
from roles.cli import jobs as cli_jobs
from roles.cli import objectives as cli_objectives
from roles.cli import schedules as cli_schedules
from roles.cli.main import main

ESC = "\x1b]0;pwned\x07\x1b[2J\x9b31m"
API = ["--api-url", "http://a"]


def mock(
    monkeypatch: pytest.MonkeyPatch, answer: Callable[[httpx.Request], httpx.Response]
) -> list[httpx.Request]:
    sent: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return answer(request)

    class Mocked(cli_client.ApiClient):
        def __init__(self, url: str, token: str | None) -> None:
            Client.__init__(self, url, token or "", transport=httpx.MockTransport(record))

    for module in (cli_jobs, cli_objectives, cli_schedules):
        monkeypatch.setattr(module, "ApiClient", Mocked)
    return sent


JOB: dict[str, Any] = {
    "jobId": "j-1",
    "agentId": f"evil{ESC}",
    "kind": "factory.task.run",
    "status": "failed",
    "attempt": 1,
    "maxAttempts": 2,
    "lane": "collect",
    "route": "r",
    "createdAt": "now",
    "sessionKey": f"s{ESC}",
    "error": f"boom{ESC}\nforged line",
}


def clean(text: str) -> bool:
    return not any(char in text for char in "\x1b\x07\x9b")


@pytest.mark.parametrize(
    "args",
    [["jobs", "ls"], ["jobs", "get", "j-1"], ["jobs", "events", "j-1"]],
)
def test_human_output_escapes_a_tenants_control_characters(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/jobs":
            return httpx.Response(200, json={"jobs": [JOB], "nextCursor": None})
        if request.url.path.endswith("/events"):
            if request.url.params["after"] != "0":
                return httpx.Response(200, json={"receipts": [], "lastSeq": 1})
            receipt = {"seq": 1, "recordedAt": "now", "type": f"t{ESC}", "data": {"x": ESC}}
            return httpx.Response(200, json={"receipts": [receipt], "lastSeq": 1})
        return httpx.Response(200, json=JOB)

    mock(monkeypatch, answer)
    ran = CliRunner().invoke(main, [*args, *API])
    assert ran.exit_code == 0, ran.output
    assert clean(ran.stdout) and "\\x1b" in ran.stdout
    assert "\nforged line" not in ran.stdout


def test_an_api_error_echoing_a_hostile_id_is_one_escaped_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    refusal = {"error": {"code": "not_found", "message": f"no job {ESC}\nforged"}}
    mock(monkeypatch, lambda request: httpx.Response(404, json=refusal))
    ran = CliRunner().invoke(main, ["jobs", "get", "x", *API])
    assert ran.exit_code == 3 and ran.stdout == ""
    assert clean(ran.stderr) and len(ran.stderr.strip().splitlines()) == 1, ran.stderr


def test_an_objectives_task_output_is_shown_escaped() -> None:
    task = {"taskId": "t", "status": "running", "maxAttempts": 2, "lastOutput": "\x1b[31mred"}
    view = {"objectiveId": "o", "status": "active", "phase": "run", "tasks": [task]}
    lines = "\n".join(cli_objectives.task_lines(view))
    assert clean(lines) and "\\x1b[31mred" in lines


def test_json_output_carries_c1_controls_escaped_and_stays_valid() -> None:
    assert json.loads(cli_client._dump({"x": ESC})) == {"x": ESC}
    assert clean(cli_client._dump({"x": ESC})) and clean(cli_client._compact({"x": ESC}))


@pytest.mark.parametrize(
    "args",
    [
        ["jobs", "events", "j-1", "--follow"],
        ["enqueue", "codex", "--kind", "factory.task.run", "--job-id", "j-1", "--wait"],
    ],
)
def test_ctrl_c_during_a_follow_or_a_wait_exits_130_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            job = {**JOB, "status": "queued", "agentId": "codex"}
            accepted = {"job": job, "outcome": "created", "async": {"eventsUrl": "/e"}}
            return httpx.Response(202, json=accepted)
        raise KeyboardInterrupt  # the user's Ctrl-C while the stream is read

    mock(monkeypatch, answer)
    ran = CliRunner().invoke(main, [*args, *API])
    assert ran.exit_code == 130, (ran.exit_code, ran.output)
    assert "Traceback" not in ran.output and "Aborted" not in ran.output


@pytest.mark.parametrize(
    "args",
    [
        ["enqueue", "codex", "--kind", "factory.task.run", "--payload", '{"x": NaN}'],
        ["jobs", "steer", "j-1", "--payload", "[Infinity]"],
        ["schedules", "create", "--agent", "a", "--interval", "1h", "--job", '{"x": -Infinity}'],
    ],
)
def test_json_the_api_cannot_carry_is_a_usage_error_naming_the_option(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    sent = mock(monkeypatch, lambda request: httpx.Response(500))
    ran = CliRunner().invoke(main, [*args, *API])
    assert ran.exit_code == 2, (ran.exit_code, ran.output)
    assert "not valid JSON" in ran.stderr and sent == []


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("bad.yaml", b"title: t\nx: .nan\n", "not valid JSON"),
        ("bad.yaml", b"title: t\nwhen: !!binary aGk=\n", "not valid JSON"),
        ("bad.json", b'{"x": NaN}', "not valid JSON"),
        ("latin.yaml", b"\xff\xfetitle: t", "not UTF-8"),
        ("broken.yaml", b"a: [", "not valid YAML/JSON"),
    ],
)
def test_an_objective_file_the_api_cannot_take_is_a_one_line_usage_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, content: bytes, says: str
) -> None:
    sent = mock(monkeypatch, lambda request: httpx.Response(500))
    (tmp_path / name).write_bytes(content)
    ran = CliRunner().invoke(main, ["objectives", "run", str(tmp_path / name), *API])
    assert ran.exit_code == 2, (ran.exit_code, ran.output)
    error = ran.stderr.strip().splitlines()[-1]
    assert error.startswith("Error: Invalid value for FILE") and says in error, ran.stderr
    assert sent == []


def test_a_yaml_date_is_sent_as_written(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    file = tmp_path / "objective.yaml"
    file.write_text("title: release 2026-01-02\ndue: 2026-01-02\nat: 2026-01-02 10:00:00\n")
    assert cli_objectives.load_objective(file) == {
        "title": "release 2026-01-02",
        "due": "2026-01-02",
        "at": "2026-01-02 10:00:00",
    }


@pytest.mark.parametrize(
    ("status", "exit_code"), [(404, 3), (409, 3), (422, 3), (429, 4), (502, 4), (503, 4)]
)
def test_the_exit_status_tells_a_refusal_from_a_request_to_send_again_later(
    monkeypatch: pytest.MonkeyPatch, status: int, exit_code: int
) -> None:
    """A script must tell 'refused: sending it again changes nothing' (3) from 'the API was
    away, without its database or at a limit: the same command may succeed later' (4); every
    one was 3."""
    refusal = {"error": {"code": "x", "message": "no"}}
    headers = {"Retry-After": "1"} if status in (429, 503) else {}
    mock(monkeypatch, lambda request: httpx.Response(status, json=refusal, headers=headers))
    ran = CliRunner().invoke(main, ["jobs", "get", "x", *API])
    assert ran.exit_code == exit_code, ran.output


def test_an_api_that_cannot_be_reached_is_exit_status_4() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ran = CliRunner().invoke(main, ["jobs", "get", "x", "--api-url", f"http://127.0.0.1:{port}"])
    assert ran.exit_code == 4 and "cannot reach the API" in ran.stderr, ran.output


def test_jobs_ls_prints_nothing_on_stdout_when_the_api_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    refusal = {"error": {"code": "unauthorized", "message": "no token"}}
    mock(monkeypatch, lambda request: httpx.Response(401, json=refusal))
    ran = CliRunner().invoke(main, ["jobs", "ls", *API])
    assert ran.exit_code == 3 and ran.stdout == "", ran.stdout
    assert ran.stderr.startswith("error: no token (401 unauthorized)")


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "ftp://api.example", "http://", "api"])
def test_an_api_url_that_is_not_http_is_a_usage_error_naming_the_option(url: str) -> None:
    """It was sent anyway, and reported as 'no answer from the API' (exit 3)."""
    result = CliRunner().invoke(main, ["jobs", "ls", "--api-url", url])
    assert result.exit_code == 2, result.output
    assert "--api-url" in result.output and "not an http:// or https:// URL" in result.output
