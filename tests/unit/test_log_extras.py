"""A log call's `extra` must not name an attribute of the LogRecord (`created`, `name`, `msg`, …):
the logging module raises KeyError for it, at the call, only when the level is enabled — a
line at INFO that the tests (at WARNING) never format fails every pass of its loop in a role
logging at INFO (the redrive's `created` did)."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("receipts", "roles", "activities", "workflows", "receipt_worker", "tools")
RESERVED = set(vars(logging.LogRecord("n", logging.INFO, "p", 1, "m", None, None))) | {
    "message",
    "asctime",
}


def test_no_log_extra_names_a_log_record_attribute() -> None:
    clashes = []
    checked = 0
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.Call):
                    continue
                for keyword in node.keywords:
                    if keyword.arg != "extra" or not isinstance(keyword.value, ast.Dict):
                        continue
                    for key in keyword.value.keys:
                        if isinstance(key, ast.Constant) and isinstance(key.value, str):
                            checked += 1
                            if key.value in RESERVED:
                                where = path.relative_to(ROOT)
                                clashes.append(f"{where}:{key.lineno} {key.value!r}")
    assert checked > 300  # the scan sees the product's log calls (387 keys on 12-06)
    assert clashes == []
