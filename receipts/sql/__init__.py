"""Every SQL statement of the project: numbered migrations and named queries in `*.sql` files."""

from __future__ import annotations

import re
import textwrap
from functools import cache
from importlib import resources
from typing import NamedTuple


class Migration(NamedTuple):
    """One numbered schema migration."""

    version: int
    name: str
    sql: str


_NAME = re.compile(r"^--\s*name:\s*(\S+)\s*$", re.MULTILINE)
# A line `-- include: <name>` stands for that named statement (without its comment lines,
# indented as the line is), so a part several statements share — the insert of an append's
# receipts — is written once.
_INCLUDE = re.compile(r"^([ \t]*)--\s*include:\s*(\S+)\s*$", re.MULTILINE)


@cache
def queries() -> dict[str, str]:
    """Return the named statements of every `*.sql` file here, keyed by their `-- name:` line,
    with their `-- include:` lines replaced by the statements they name."""
    named: dict[str, str] = {}
    folder = resources.files(__package__)
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        parts = _NAME.split(entry.read_text(encoding="utf-8"))
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in named:
                raise ValueError(f"{entry.name} defines {name!r} a second time")
            named[name] = body.strip().rstrip(";")
    return {name: _from_first_clause(body) for name, body in expand_includes(named).items()}


def _from_first_clause(statement: str) -> str:
    """`statement` without the comment lines before its first clause: they document it here,
    and a tool that names a statement by its first word (the psycopg instrumentation's spans)
    named every such one `--`."""
    lines = statement.splitlines()
    while lines and lines[0].lstrip().startswith("--"):
        lines.pop(0)
    return "\n".join(lines)


def expand_includes(named: dict[str, str]) -> dict[str, str]:
    """Return the statements with each `-- include: <name>` line replaced by the statement
    `<name>`, its comment lines left out, indented as the line is (one level: an included
    statement's own includes are not expanded). An unknown name raises `ValueError`."""

    def included(line: re.Match[str]) -> str:
        indent, name = line[1], line[2]
        if name not in named:
            raise ValueError(f"-- include: {name} names no statement")
        lines = [text for text in named[name].splitlines() if not text.startswith("--")]
        return textwrap.indent("\n".join(lines), indent)

    return {name: _INCLUDE.sub(included, body) for name, body in named.items()}


def query(name: str) -> str:
    """Return one named statement (see `queries`)."""
    return queries()[name]


@cache
def migrations() -> tuple[Migration, ...]:
    """Return the migrations in version order (files `NNNN_name.sql` under migrations/)."""
    folder = resources.files(__package__).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    return tuple(sorted(found))
