"""`receipt objectives run --wait` when the API goes away: it follows through a short outage and
then exits 3 (an API error), never with a traceback and 1 (which says the objective failed)."""

from __future__ import annotations

import socket

import pytest

from roles.cli import objectives
from roles.cli.client import EXIT_API_ERROR, ApiClient, ApiFailure


def test_an_api_that_cannot_be_reached_is_an_api_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(objectives, "UNREACHABLE_S", 0.3)
    monkeypatch.setattr(objectives, "POLL_S", 0.05)
    client = ApiClient(f"http://127.0.0.1:{port}", None)
    with pytest.raises(ApiFailure, match="could not be reached") as failed:
        objectives.follow(client, "release", False, "objective:release:run")
    assert failed.value.exit_code == EXIT_API_ERROR == 3
