"""A log line's bounds, exactly (tests/integration/test_handler_log_lines.py has a handler make
lines of megabytes): a field is cut to at most `MAX_FIELD_CHARS`, keeping its start and its end
and saying how many characters went; a text within the bound is left whole; the extras that do
not fit a line are dropped from the first that does not, in order, and counted."""

from __future__ import annotations

import json
import logging
import re
import sys

import pytest

from roles.infra.logs import (
    MAX_FIELD_CHARS,
    MAX_LINE_CHARS,
    HumanFormatter,
    JsonFormatter,
    _fitted,
    cut,
)


@pytest.mark.parametrize("limit", [100, 1_000, MAX_FIELD_CHARS])
def test_a_text_within_its_bound_is_whole_and_one_past_it_is_cut_to_it(limit: int) -> None:
    assert cut("a" * limit, limit) == "a" * limit
    assert cut("", limit) == ""
    for length in (limit + 1, limit * 3 + 7, limit * 50):
        text = "".join(chr(ord("a") + i % 26) for i in range(length))
        short = cut(text, limit)
        assert len(short) <= limit, (length, len(short))
        head, count, tail = re.fullmatch(
            r"(.*)… \[(\d+) characters cut\] …(.*)", short, re.DOTALL
        ).groups()  # type: ignore[union-attr]
        # Its start and its end, most of the room the start's, and the count says what went.
        assert text.startswith(head) and text.endswith(tail) and tail
        assert len(head) > len(tail) and len(head) + len(tail) >= limit - 45
        assert int(count) == length - len(head) - len(tail)


def test_the_default_bound_is_the_field_bound() -> None:
    assert cut("x" * MAX_FIELD_CHARS) == "x" * MAX_FIELD_CHARS
    assert len(cut("x" * (MAX_FIELD_CHARS + 1))) <= MAX_FIELD_CHARS


def test_the_extras_that_fit_are_kept_in_order_from_the_first_and_the_rest_counted() -> None:
    fields = ["a" * 10, "b" * 10, "c" * 10, "d" * 2]
    # Each field takes its length and 2 (", ").
    assert _fitted(fields, 36) == (fields[:3], 1)
    assert _fitted(fields, 35) == (fields[:2], 2)
    # In order: a small field after the first that does not fit is not kept in its place.
    assert _fitted(fields, 25) == (fields[:2], 2)
    assert _fitted(fields, 11) == ([], 4)
    assert _fitted(fields, 12) == (fields[:1], 3)
    assert _fitted([], 0) == ([], 0)


def _record(msg: str, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("release_bot", logging.WARNING, __file__, 1, msg, None, None)
    record.__dict__.update(extra)
    return record


@pytest.mark.parametrize("formatter", [JsonFormatter("worker"), HumanFormatter("worker")])
def test_a_line_of_many_fields_keeps_its_first_fields_and_counts_the_rest(
    formatter: logging.Formatter,
) -> None:
    many = {f"field{i:03}": "v" * 1_000 for i in range(200)}
    line = formatter.format(_record("many fields", event="x.many", **many))
    assert MAX_LINE_CHARS - 2_000 < len(line) <= MAX_LINE_CHARS
    kept = re.findall(r"field(\d{3})", line)
    assert kept == [f"{i:03}" for i in range(len(kept))]  # the first ones, in order
    dropped = 200 - len(kept)
    assert dropped > 0
    if isinstance(formatter, JsonFormatter):
        body = json.loads(line)
        assert body["fieldsCut"] == dropped and body["event"] == "x.many"
        assert body["msg"] == "many fields" and body["level"] == "warning"
    else:
        assert line.endswith(f"fieldsCut={dropped}")


@pytest.mark.parametrize("formatter", [JsonFormatter("worker"), HumanFormatter("worker")])
def test_a_line_within_its_bounds_is_left_whole(formatter: logging.Formatter) -> None:
    text = "m" * MAX_FIELD_CHARS
    line = formatter.format(_record(text, note="n" * MAX_FIELD_CHARS, event="x.whole"))
    assert "characters cut" not in line and "fieldsCut" not in line
    assert text in line and "n" * MAX_FIELD_CHARS in line


@pytest.mark.parametrize("formatter", [JsonFormatter("worker"), HumanFormatter("worker")])
def test_a_line_with_a_traceback_and_many_fields_keeps_within_its_bound(
    formatter: logging.Formatter,
) -> None:
    """The traceback comes last, whole up to a field's bound: the extras make room for it."""
    try:
        raise ValueError("x" * 100_000)
    except ValueError:
        exc_info = sys.exc_info()
    record = _record("failed", **{f"field{i:03}": "v" * 1_000 for i in range(200)})
    record.exc_info = exc_info
    line = formatter.format(record)
    assert len(line) <= MAX_LINE_CHARS
    assert "ValueError: xxxx" in line and "characters cut" in line
    assert re.search(r"fieldsCut\W+\d+", line)
