"""Every SQL statement of the project: numbered migrations and named queries in `*.sql` files."""

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
    """Return the named statements of every `*.sql` file here, keyed by their `-- name:` line."""
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
    return named


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
