"""`receipt up`'s start-up decisions: the examples it starts with, and what it says when the
command sandbox cannot run on the host."""

from __future__ import annotations

from pathlib import Path

from roles.cli.up import EXAMPLES, example_defaults, userns_advice


def test_the_checkouts_examples_fill_in_what_is_not_set_and_the_sandbox_may_read_them() -> None:
    env = {"RECEIPT_CODEX_COMMAND": "codex exec -", "RECEIPT_SANDBOX_RO_BINDS": "/opt/tools"}
    chosen = example_defaults(env)
    assert chosen == ["RECEIPT_AGENTS_FILE", "RECEIPT_FACTORY_PLANNER_COMMAND"]
    assert env["RECEIPT_AGENTS_FILE"] == str(EXAMPLES / "agents.yaml")
    assert env["RECEIPT_FACTORY_PLANNER_COMMAND"] == f"python3 {EXAMPLES / 'planner.py'}"
    assert env["RECEIPT_CODEX_COMMAND"] == "codex exec -"  # the operator's own is kept
    assert env["RECEIPT_SANDBOX_RO_BINDS"] == f"/opt/tools:{EXAMPLES}"
    assert example_defaults(env) == []  # nothing left to fill in, nothing bound twice
    assert env["RECEIPT_SANDBOX_RO_BINDS"].count(str(EXAMPLES)) == 1


def test_outside_a_checkout_nothing_is_filled_in(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    assert example_defaults(env, tmp_path) == [] and env == {}


def test_a_host_whose_apparmor_restricts_user_namespaces_is_told_the_fix(tmp_path: Path) -> None:
    sysctl = tmp_path / "apparmor_restrict_unprivileged_userns"
    sysctl.write_text("1\n")
    advice = userns_advice(sysctl)
    assert "sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0" in advice
    sysctl.write_text("0\n")
    assert "apparmor" not in userns_advice(sysctl).lower()
    assert "RECEIPT_CODEX_SANDBOX=none" in userns_advice(tmp_path / "absent")


def test_the_start_up_lines_name_only_the_metrics_ports_that_are_served() -> None:
    """README's `make up` lines: the api's /metrics is on its API port (no port 9475 is served
    unless RECEIPT_METRICS_PORT is set), the four other roles on 9471-9474."""
    from roles.cli.up import metrics_ports
    from roles.infra.settings import ProcessSettings

    line = metrics_ports(ProcessSettings())
    assert line == "driver :9471, worker-chat :9472, worker-codex :9473, worker-control :9474"
    chosen = metrics_ports(ProcessSettings.model_validate({"RECEIPT_METRICS_PORT": "0"}))
    assert ":947" not in chosen and "RECEIPT_METRICS_PORT" in chosen
