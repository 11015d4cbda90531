"""The shutdown's figures the docs and `receipt up --help` give are the code's: the close's
bound (`role.close_stuck`), a role's stop bound past the grace, and how long `receipt up` waits
before it SIGKILLs a role. They are read by operators sizing `terminationGracePeriodSeconds`."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from roles.api.settings import GRACEFUL_SHUTDOWN_S
from roles.cli.main import main
from roles.cli.up import KILL_SLACK_S, kill_after_s
from roles.infra.process import CLOSE_S, EXIT_S, GATEWAY_STOP_S, SHUTDOWN_MARGIN, stop_bound_s
from roles.infra.settings import load

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = (ROOT / "docs" / "operations.md").read_text()
README = (ROOT / "README.md").read_text()


def seconds(value: float) -> str:
    return f"{value:g} s"


def test_the_close_bound_the_docs_give_is_the_codes() -> None:
    """`role.close_stuck` is logged once the close outlives `CLOSE_S` (5 s), as the shutdown
    paragraph says; its row said 10 s."""
    (row,) = [line for line in OPERATIONS.splitlines() if line.startswith("| `role.close_stuck`")]
    assert f"took over {seconds(CLOSE_S)}" in row
    assert f"bounded at {seconds(CLOSE_S)} (`role.close_stuck`)" in " ".join(OPERATIONS.split())


def test_the_stop_bounds_the_docs_and_the_help_give_are_the_codes() -> None:
    settings = load({})
    grace_s = settings.process.shutdown_grace_ms / 1000
    margin_s = SHUTDOWN_MARGIN.total_seconds()
    past_grace = margin_s + EXIT_S
    operations = " ".join(OPERATIONS.split())
    readme = " ".join(README.split())
    assert f"the grace plus {seconds(past_grace)}" in operations
    assert f"{seconds(past_grace + GATEWAY_STOP_S)} for worker-codex" in operations
    assert f"A role exits at most {seconds(past_grace)} past the grace" in readme

    kill_s = kill_after_s(settings)
    assert kill_s == stop_bound_s(grace_s) + KILL_SLACK_S
    assert f"({seconds(kill_s)} at the default grace" in operations
    assert f"({seconds(kill_s)} at the default grace)" in readme

    result = CliRunner().invoke(main, ["up", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    help_text = " ".join(result.output.split())
    worker = re.search(r"the grace plus (\d+) s \((\d+) s at the default\)", help_text)
    api = re.search(r"the api's drain delay plus (\d+) s", help_text)
    assert worker and api, help_text
    assert float(worker[1]) == kill_s - grace_s
    assert float(worker[2]) == kill_s
    assert float(api[1]) == GRACEFUL_SHUTDOWN_S + EXIT_S + KILL_SLACK_S


def test_the_api_commands_help_names_the_direct_url_its_listener_and_migration_use() -> None:
    """`receipt api` migrates and LISTENs through RECEIPT_DATABASE_DIRECT_URL when it is set
    (roles/api/app.py); its help named RECEIPT_DATABASE_URL alone."""
    result = CliRunner().invoke(main, ["api", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "RECEIPT_DATABASE_DIRECT_URL" in result.output
