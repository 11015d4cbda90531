"""Every SQL statement of the project: numbered migrations and the named queries in queries.sql."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import NamedTuple


class Migration(NamedTuple):
    """One numbered schema migration."""

    version: int
    name: str
    sql: str


_NAME = re.compile(r"^--\s*name:\s*(\S+)\s*$", re.MULTILINE)


@cache
def queries() -> dict[str, str]:
    """Return the named statements of queries.sql, keyed by their `-- name:` line."""
    text = resources.files(__package__).joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _NAME.split(text)
    named: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in named:
            raise ValueError(f"queries.sql defines {name!r} twice")
        named[name] = body.strip().rstrip(";")
    return named


def query(name: str) -> str:
    """Return one named statement of queries.sql."""
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
