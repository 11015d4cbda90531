"""`receipt objectives run --wait` when the API goes away: it follows through a short outage and
then exits 3 (an API error), never with a traceback and 1 (which says the objective failed)."""

from __future__ import annotations

import socket
import time
from types import SimpleNamespace

import httpx
import pytest

from receipt_client import Client
from roles.cli import objectives
from roles.cli.client import EXIT_API_ERROR, EXIT_TRY_AGAIN, ApiClient, ApiFailure


def test_an_api_that_cannot_be_reached_is_one_to_try_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(objectives, "UNREACHABLE_S", 0.3)
    monkeypatch.setattr(objectives, "POLL_S", 0.05)
    client = ApiClient(f"http://127.0.0.1:{port}", None)
    with pytest.raises(ApiFailure, match="could not be reached") as failed:
        objectives.follow(client, "release", False, "objective:release:run")
    assert failed.value.exit_code == EXIT_TRY_AGAIN == 4


def mocked(answers: dict[str, list[httpx.Response]], seen: list[str]) -> ApiClient:
    """A CLI client of an API answering each path with its next answer (the last repeats)."""

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        queue = answers[request.url.path]
        return queue.pop(0) if len(queue) > 1 else queue[0]

    class Mocked(ApiClient):
        def __init__(self) -> None:
            Client.__init__(self, "http://api", "", transport=httpx.MockTransport(answer))

    return Mocked()


COMPLETED = {"objectiveId": "release", "status": "completed", "phase": "done", "tasks": []}


def test_a_proxy_s_502_or_504_is_followed_through_as_an_api_away(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(objectives, "POLL_S", 0.01)
    away = [httpx.Response(code, json={"error": "bad_gateway"}) for code in (502, 504, 503)]
    seen: list[str] = []
    client = mocked({"/objectives/release": [*away, httpx.Response(200, json=COMPLETED)]}, seen)
    assert objectives.follow(client, "release", True, "objective:release:run") == 0
    assert seen == ["/objectives/release"] * 4


def bound_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `follow` fail after 20 polls (instead of waiting forever)."""
    polls: list[float] = []

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        assert len(polls) < 20, "still waiting for an objective that will never exist"

    monkeypatch.setattr(objectives, "time", SimpleNamespace(monotonic=time.monotonic, sleep=sleep))


def test_an_error_other_than_404_is_the_api_s_and_not_waited_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bound_the_wait(monkeypatch)
    refused = httpx.Response(403, json={"error": "forbidden", "message": "not yours"})
    seen: list[str] = []
    client = mocked({"/objectives/release": [refused]}, seen)
    with pytest.raises(ApiFailure, match="not yours") as failed:
        objectives.follow(client, "release", True, "objective:release:run")
    assert failed.value.exit_code == EXIT_API_ERROR
    assert all(path == "/objectives/release" for path in seen)


@pytest.mark.parametrize("status", ["failed", "canceled"])
def test_a_run_job_that_ended_without_the_objective_is_an_api_error(
    monkeypatch: pytest.MonkeyPatch, status: str
) -> None:
    """Its objective will never exist: the wait ends (exit 3) naming the run job's error."""
    bound_the_wait(monkeypatch)
    missing = httpx.Response(404, json={"error": "not_found", "message": "no such objective"})
    job = {"jobId": "objective:release:run", "status": status, "error": {"message": "bad graph"}}
    seen: list[str] = []
    client = mocked(
        {
            "/objectives/release": [missing],
            "/jobs/objective:release:run": [httpx.Response(200, json=job)],
        },
        seen,
    )
    with pytest.raises(ApiFailure, match=r"was not created.*bad graph") as failed:
        objectives.follow(client, "release", True, "objective:release:run")
    assert failed.value.exit_code == EXIT_API_ERROR


@pytest.mark.parametrize(
    ("status", "exit_code"), [("completed", 0), ("failed", 1), ("canceled", 1)]
)
def test_the_wait_ends_once_the_audit_is_written_and_exits_by_the_status(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], status: str, exit_code: int
) -> None:
    """Settled but not yet audited, the objective is followed on; its exit status says how it
    ended (0 completed, 1 failed or canceled)."""
    bound_the_wait(monkeypatch)
    settled = {**COMPLETED, "status": status, "auditJobId": "objective:release:audit"}
    totals = {"completed": 0, "tasks": 0, "tries": 0, "durationMs": 7}
    answers = [httpx.Response(200, json={**settled, "audit": None})] * 2
    answers.append(httpx.Response(200, json={**settled, "audit": {"totals": totals}}))
    seen: list[str] = []
    client = mocked({"/objectives/release": answers}, seen)
    assert objectives.follow(client, "release", False, "objective:release:run") == exit_code
    assert (
        len(seen) == 3 and "audited: 0/0 tasks completed, 0 tries, 7 ms" in capsys.readouterr().out
    )
