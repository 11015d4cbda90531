"""Text hygiene for `jsonb`: reject (at the door) or sanitise (from handlers) NUL and lone surrogates.

The check walks a document once without building anything; only when it finds a bad string
does it walk again to name the field at fault (a path per node made a 1 MiB body of
260 000 list items cost seconds).
"""

from __future__ import annotations

import math
import re
from typing import Any

from receipts.errors import InvalidInput

_BAD = re.compile("[\x00\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def _path(parent: str, key: object) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else str(key)


def _first_bad(value: Any) -> bool:
    """True when any string or key in `value` holds NUL or a lone surrogate (iterative, no paths)."""
    pending: list[Any] = [value]
    search = _BAD.search
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if search(item):
                return True
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str) and search(key):
                    return True
                pending.append(child)
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
    return False


def _bad_field(value: Any, field: str) -> str | None:
    """Return the path of the first bad string in `value` (walked only after `_first_bad`)."""
    pending: list[tuple[Any, str]] = [(value, field)]
    while pending:
        item, at = pending.pop()
        if isinstance(item, str):
            if _BAD.search(item):
                return at
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                if isinstance(key, str) and _BAD.search(key):
                    return _path(at, key)
                pending.append((child, _path(at, key)))
        elif isinstance(item, (list, tuple)):
            pending.extend((child, _path(at, i)) for i, child in reversed(list(enumerate(item))))
    return None


def check_clean_text(value: Any, field: str) -> None:
    """Raise `InvalidInput` if any string (or key) in `value` holds NUL or a lone surrogate.

    PostgreSQL's `jsonb` rejects both, so they are refused before anything is written.
    """
    if not _first_bad(value):
        return
    at = _bad_field(value, field) or field
    raise InvalidInput(
        at or "body",
        f"{at or 'body'} contains a NUL character or an unpaired UTF-16 surrogate, "
        "which cannot be stored",
    )


def sanitize(value: Any) -> Any:
    """Return `value` with NUL and lone surrogates replaced by U+FFFD, bytes decoded as UTF-8,
    and a non-finite number (NaN, ±Infinity: Python's json writes them, `jsonb` refuses them, so
    a settle would fail and be retried for ever) as null, as JSON.stringify writes it."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if isinstance(value, str):
        return _BAD.sub(REPLACEMENT, value)
    if isinstance(value, dict):
        return {sanitize(str(k)): sanitize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [sanitize(v) for v in value]
    return value
