"""The handler SDK's declarations and how a worker loads installed handlers (entry points)."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from activities.handlers.sdk import HandlerConflict, load_installed
from receipt_worker import AgentHandler, JobContext, handler
from receipts.kinds import HANDLERS_ENTRY_POINTS


@handler("unit-bot", kinds=["factory.task.run", "factory.task.run"])
async def unit_bot(job: JobContext) -> None:
    """A handler for the loader to find."""


def point(name: str, value: str) -> EntryPoint:
    return EntryPoint(name, value, HANDLERS_ENTRY_POINTS)


def test_a_declaration_names_its_agent_kinds_and_sandbox() -> None:
    assert isinstance(unit_bot, AgentHandler)
    assert (unit_bot.agent_id, unit_bot.kinds, unit_bot.sandbox) == (
        "unit-bot",
        ("factory.task.run",),
        False,
    )
    assert unit_bot.name == f"{__name__}:unit_bot"


@pytest.mark.parametrize(
    ("agent", "kinds", "message"),
    [
        ("", ["factory.task.run"], "agent id ''"),
        ("has space", ["factory.task.run"], "agent id 'has space'"),
        ("bot", ["factory.nope"], "got factory.nope"),
        ("bot", [], "got none"),
    ],
)
def test_a_bad_declaration_is_refused_naming_what_is_allowed(
    agent: str, kinds: list[str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        handler(agent, kinds=kinds)


def test_installed_handlers_are_loaded_by_their_entry_point_name() -> None:
    installed = load_installed([point("unit-bot", f"{__name__}:unit_bot")])
    assert list(installed.handlers) == ["unit-bot"]
    assert installed.loaded == {"unit-bot": f"{__name__}:unit_bot (kinds factory.task.run)"}
    assert installed.failures == ()


def test_a_handler_that_fails_to_load_is_a_failure_naming_it() -> None:
    installed = load_installed(
        [
            point("missing", "no_such_module_anywhere:run"),
            point("wrong-name", f"{__name__}:unit_bot"),
            point("not-a-handler", f"{__name__}:point"),
        ]
    )
    assert installed.handlers == {}
    failures = "\n".join(installed.failures)
    assert "missing = no_such_module_anywhere:run: ModuleNotFoundError" in failures
    assert "wrong-name" in failures and "a handler of agent 'unit-bot'" in failures
    assert "not-a-handler" in failures and "not a @handler" in failures


def test_an_agent_id_built_in_and_installed_is_a_conflict_naming_both() -> None:
    with pytest.raises(HandlerConflict, match=r"'codex' is both built in .* codex = pkg:run"):
        load_installed([point("codex", "pkg:run")])
    with pytest.raises(HandlerConflict, match="installed twice"):
        load_installed([point("twice", "a:run"), point("twice", "b:run")])
