"""Text hygiene for `jsonb`: reject (at the door) or sanitise (from handlers) NUL and lone surrogates."""

from __future__ import annotations

import re
from typing import Any

from receipts.errors import InvalidInput

_BAD = re.compile("[\x00\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def _path(parent: str, key: object) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else str(key)


def check_clean_text(value: Any, field: str) -> None:
    """Raise `InvalidInput` if any string (or key) in `value` holds NUL or a lone surrogate.

    PostgreSQL's `jsonb` rejects both, so they are refused before anything is written.
    """
    if isinstance(value, str):
        if _BAD.search(value):
            raise InvalidInput(
                field or "body",
                f"{field or 'body'} contains a NUL character or an unpaired UTF-16 surrogate, "
                "which cannot be stored",
            )
    elif isinstance(value, dict):
        for key, item in value.items():
            check_clean_text(key, _path(field, key))
            check_clean_text(item, _path(field, key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_clean_text(item, _path(field, index))


def sanitize(value: Any) -> Any:
    """Return `value` with NUL and lone surrogates replaced by U+FFFD, bytes decoded as UTF-8."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if isinstance(value, str):
        return _BAD.sub(REPLACEMENT, value)
    if isinstance(value, dict):
        return {sanitize(str(k)): sanitize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [sanitize(v) for v in value]
    return value
