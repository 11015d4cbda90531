"""The named-statement loader's `-- include:` lines: a shared part is written once."""

from __future__ import annotations

import re

import pytest

from receipts.sql import expand_includes, queries, query


def test_an_include_line_stands_for_the_named_statement_indented_and_without_comments() -> None:
    named = {
        "part": "-- why the part is so\nINSERT INTO t (a)\nVALUES (1)\nRETURNING a",
        "whole": "WITH inserted AS (\n    -- include: part\n)\nSELECT a FROM inserted",
    }
    assert expand_includes(named)["whole"] == (
        "WITH inserted AS (\n    INSERT INTO t (a)\n    VALUES (1)\n    RETURNING a\n)\n"
        "SELECT a FROM inserted"
    )
    assert expand_includes(named)["part"] == named["part"]


def test_an_include_of_an_unknown_statement_is_refused() -> None:
    with pytest.raises(ValueError, match="-- include: nothing names no statement"):
        expand_includes({"whole": "SELECT 1\n-- include: nothing"})


def test_every_append_inserts_its_receipts_with_the_one_shared_statement() -> None:
    insert = "\n".join(
        "    " + line for line in query("insert_receipts").splitlines() if not line.startswith("--")
    )
    for name in ("append_job", "append_job_heartbeat", "append_stream"):
        assert f"WITH inserted AS (\n{insert}\n)" in query(name)
    assert not [name for name, body in queries().items() if "-- include:" in body]


def test_no_comment_of_a_statement_names_a_parameter() -> None:
    """psycopg reads `%(name)s` in a statement's comments as a parameter too: a comment that
    names one (the lines between two statements belong to the first) makes every call of that
    statement fail with 'query parameter missing'."""
    placeholder = re.compile(r"%\(\w+\)s")
    found = [
        (name, line.strip())
        for name, body in queries().items()
        for line in body.splitlines()
        if line.lstrip().startswith("--") and placeholder.search(line)
    ]
    assert found == []


def test_every_statement_begins_with_its_first_clause_not_a_comment() -> None:
    """The psycopg instrumentation names a SQL span by the statement's first word: 121 of 246
    spans of a traced run were named `--` (the comment lines that document a statement here)."""
    first_words = {name: text.split()[0] for name, text in queries().items()}
    assert not {name: word for name, word in first_words.items() if word.startswith("--")}
    assert first_words["job_get"] == "SELECT"
