"""A command's argument and an environment entry at Linux's MAX_ARG_STRLEN, exactly
(tests/integration/delivery/test_command_sizes.py posts ones past it, and runs ones at it where
bubblewrap can): at the bound an enqueue is taken, a byte past it refused naming the field. An
environment entry is `NAME=value` to the kernel: its name counts."""

from __future__ import annotations

from typing import Any

import pytest

from receipts.enqueue_request import parse_enqueue
from receipts.errors import InvalidInput
from receipts.executables import MAX_ARG_BYTES


def enqueue(task: dict[str, Any]) -> None:
    body = {
        "payload": {
            "kind": "factory.task.run",
            "authContext": {"userId": "user-1", "organizationId": "org-a"},
            "objectiveId": "adhoc-1",
            "task": task,
        }
    }
    parse_enqueue("codex", body)


def refused(task: dict[str, Any]) -> str:
    with pytest.raises(InvalidInput) as refusal:
        enqueue(task)
    assert str(MAX_ARG_BYTES) in str(refusal.value)
    return refusal.value.field


def test_an_argument_at_the_bound_is_taken_and_a_byte_more_refused() -> None:
    enqueue({"command": ["echo", "a" * MAX_ARG_BYTES]})
    assert refused({"command": ["echo", "a" * (MAX_ARG_BYTES + 1)]}) == "payload.task.command[1]"
    # In UTF-8 bytes: 2 a character here.
    enqueue({"command": ["echo", "é" * (MAX_ARG_BYTES // 2)]})
    assert refused({"command": ["echo", "é" * (MAX_ARG_BYTES // 2 + 1)]}) == (
        "payload.task.command[1]"
    )


def test_an_environment_entry_counts_its_name() -> None:
    name = "SOME_LONG_NAME"
    fits = "v" * (MAX_ARG_BYTES - len(name) - 1)
    enqueue({"command": ["true"], "env": {name: fits}})
    # The value alone is within the bound; NAME=value is not.
    assert refused({"command": ["true"], "env": {name: fits + "v"}}) == f"payload.task.env.{name}"
    assert refused({"command": ["true"], "env": {name: "é" * (len(fits) // 2 + 1)}}) == (
        f"payload.task.env.{name}"
    )
