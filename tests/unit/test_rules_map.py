"""docs/rules.md maps every rule to the tests that pin it: each test it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = re.compile(r"`((?:unit|integration|e2e|deploy)/[\w/]+\.py)::(\w+)")


def test_every_test_the_rules_map_names_exists() -> None:
    references = set(REFERENCE.findall((ROOT / "docs" / "rules.md").read_text()))
    assert len(references) > 100
    missing = [
        f"{path}::{name}"
        for path, name in sorted(references)
        if not (ROOT / "tests" / path).exists()
        or not re.search(rf"def {name}\b", (ROOT / "tests" / path).read_text())
    ]
    assert missing == []
