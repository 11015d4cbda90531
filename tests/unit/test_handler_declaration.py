"""What a handler's author meets before a job runs: a typed package, a clear error."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from receipt_worker import handler
from tests.conftest import ROOT


def test_the_handler_sdk_is_typed_for_the_packages_that_use_it() -> None:
    """Without `py.typed` in the installed `receipt`, mypy skips `receipt_worker` (import-untyped)
    and `@handler` makes every handler untyped (untyped-decorator under --strict)."""
    assert (ROOT / "receipt_worker" / "py.typed").is_file()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["receipt_worker"]


def test_handler_without_its_agent_id_says_so() -> None:
    with pytest.raises(TypeError, match=r"@handler takes the agent id first"):

        @handler  # type: ignore[arg-type]
        async def forgot(job: Any) -> None:
            return None


def test_an_error_cut_once_is_not_cut_again() -> None:
    """A failure's error is cut where the attempt settles it and again where the operation
    writes it: the second cut re-counted the first's note ("31 more characters cut")."""
    from receipts import operations as ops

    error = "ValueError: " + "x" * 5_000_000
    once = ops.bounded_error(error)
    assert len(once) <= ops.MAX_ERROR_CHARS and ops.bounded_error(once) == once
    assert once.endswith(f"({len(error) - (ops.MAX_ERROR_CHARS - 48)} more characters cut)")
