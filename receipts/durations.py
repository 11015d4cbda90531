"""Durations as operators write them: `30d`, `12h`, `90m`, `1w2d`, `3600s` (RECEIPT_RETENTION,
`receipt prune --older-than`)."""

from __future__ import annotations

import re
from datetime import timedelta

from receipts.errors import InvalidInput

_UNITS = {"s": 1, "m": 60, "h": 3_600, "d": 86_400, "w": 604_800}
# The longest duration taken: a hundred years (a longer one is no later cutoff a database or
# `datetime` can hold).
MAX_SECONDS = 100 * 365 * 86_400
_DURATION = re.compile(r"(\d{1,15})\s*([smhdw])")


def parse_duration(text: str, *, name: str = "duration") -> timedelta | None:
    """Parse `30d`, `12h`, `90m`, `1w2d`, `3600s`; `0` means "keep everything" (None).

    Anything else raises `InvalidInput` naming `name` and the accepted forms.
    """
    raw = (text or "").strip().lower()
    if raw in ("0", ""):
        return None
    pos, seconds = 0, 0
    for match in _DURATION.finditer(raw):
        if match.start() != pos:
            break
        seconds += int(match[1]) * _UNITS[match[2]]
        pos = match.end()
    if pos != len(raw) or seconds <= 0 or seconds > MAX_SECONDS:
        raise InvalidInput(
            name,
            f"{name} must be a duration such as 30d, 12h, 90m, 1w2d or 3600s "
            f"(units s, m, h, d, w) of at most 100 years, or 0 to keep everything; got {text!r}",
        )
    return timedelta(seconds=seconds)
