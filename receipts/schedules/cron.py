"""When a schedule fires: five-field cron expressions and fixed intervals, validated at create
with an error naming what is wrong, and the next fire times (pure; the API shows them, Temporal
fires them from the same spec).

A cron expression is `minute hour day-of-month month day-of-week` in the schedule's time zone:
`*`, numbers, ranges `a-b`, steps `*/n` and `a-b/n`, lists `a,b`, month names `jan`…`dec`,
day names `sun`…`sat` (0 and 7 are Sunday), and `@hourly`, `@daily`, `@weekly`, `@monthly`,
`@yearly`. When both day fields are restricted a day matching either fires, as cron does. A
local time that a daylight-saving change skips does not fire that day; one that occurs twice
is shown at its first occurrence, and fires once (Temporal fires one occurrence or both; the
firing of the second is `repeated`: receipts/schedules/firing.py `fire`).

An interval fires at the multiples of its length since the Unix epoch (as Temporal's interval
spec with no offset does), whatever the time zone.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

MACROS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# (name, low, high, names that stand for low, low + 1, …)
FIELDS: tuple[tuple[str, int, int, tuple[str, ...]], ...] = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, MONTHS),
    ("day of week", 0, 7, DAYS),
)
# ASCII digits only (`str.isdigit` and `\d` take `²` and other scripts' digits, which `int`
# refuses), and a cron value or step of at most four: no number is handed to `int` at any
# length (an interval past twelve digits is refused as too long before it is).
_INTERVAL = re.compile(r"^([0-9]+)(s|m|h|d)$")
_NUMBER = re.compile(r"^[0-9]{1,4}$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_INTERVAL_S = 366 * 86_400  # a year (and a leap day): what a cron expression can say
SEARCH_DAYS = 366 * 5  # a cron that matches no day in five years matches none (30 feb)


class SpecError(ValueError):
    """A cron expression, interval or time zone that cannot be used; the message says why."""


@dataclass(frozen=True)
class Cron:
    """A parsed cron expression: the values each field matches."""

    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool  # day of month was `*`
    any_weekday: bool  # day of week was `*`

    def matches_day(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return in_month and in_week
        return in_month or in_week


def _value(text: str, field: str, low: int, high: int, names: tuple[str, ...]) -> int:
    lowered = text.lower()
    if lowered in names:
        return low + names.index(lowered)
    if not _NUMBER.match(text):
        allowed = f"{low}-{high}" + (f" or {names[0]}-{names[-1]}" if names else "")
        raise SpecError(f"{field}: {text!r} is not a value ({allowed})")
    value = int(text)
    if not low <= value <= high:
        raise SpecError(f"{field}: {value} is out of range {low}-{high}")
    return value


def _field(text: str, field: str, low: int, high: int, names: tuple[str, ...]) -> set[int]:
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise SpecError(f"{field}: an empty list item in {text!r}")
        span, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not _NUMBER.match(step_text) or int(step_text) < 1:
                raise SpecError(f"{field}: step {step_text!r} is not a positive number")
            step = int(step_text)
        if span == "*":
            first, last = low, high
        elif "-" in span:
            a, _, b = span.partition("-")
            first, last = (_value(a, field, low, high, names), _value(b, field, low, high, names))
            if first > last:
                raise SpecError(f"{field}: range {span!r} runs backwards")
        else:
            first = _value(span, field, low, high, names)
            last = high if step_text else first
        values.update(range(first, last + 1, step))
    return values


def parse_cron(expression: str) -> Cron:
    """Parse a five-field cron expression (or a macro); raise SpecError naming the field."""
    text = MACROS.get(expression.strip().lower(), expression.strip())
    parts = text.split()
    if len(parts) != len(FIELDS):
        raise SpecError(
            f"{expression!r} has {len(parts)} fields; a cron expression has five "
            "(minute hour day-of-month month day-of-week) or is one of " + ", ".join(MACROS)
        )
    minute, hour, day, month, weekday = (
        _field(part, name, low, high, names)
        for part, (name, low, high, names) in zip(parts, FIELDS, strict=True)
    )
    if 7 in weekday:
        weekday = (weekday - {7}) | {0}
    return Cron(
        minutes=tuple(sorted(minute)),
        hours=tuple(sorted(hour)),
        days=frozenset(day),
        months=frozenset(month),
        weekdays=frozenset(weekday),
        any_day=parts[2] == "*",
        any_weekday=parts[4] == "*",
    )


def parse_interval(text: str, minimum_s: int) -> int:
    """An interval like `30s`, `5m`, `2h`, `1d` in seconds; at least `minimum_s`."""
    found = _INTERVAL.match(text.strip())
    if not found:
        raise SpecError(f"{text!r} is not an interval: a number and s, m, h or d (e.g. 15m)")
    seconds = int(found[1]) * _UNIT_S[found[2]] if len(found[1]) <= 12 else MAX_INTERVAL_S + 1
    if seconds > MAX_INTERVAL_S:
        raise SpecError(f"{text!r} is longer than the longest interval allowed, 366 days")
    if seconds < minimum_s:
        raise SpecError(f"{text!r} is shorter than the shortest interval allowed, {minimum_s} s")
    return seconds


# Names a zone database answers that are not zones a schedule can mean: `localtime` is the
# zone of whichever host reads it (the api, worker-control and Temporal could disagree), and
# `posix/…`, `right/…` (leap seconds), `posixrules` and `Factory` are the database's own
# variants, which Temporal's server may not know: its schedule would never be written.
_NOT_ZONES = ("localtime", "posixrules", "Factory")
_NOT_ZONE_PREFIXES = ("posix/", "right/")


def zone(name: str) -> ZoneInfo:
    """The IANA time zone `name`, or SpecError."""
    message = f"{name!r} is not an IANA time zone (e.g. UTC, Europe/Paris)"
    if name in _NOT_ZONES or name.startswith(_NOT_ZONE_PREFIXES):
        raise SpecError(message)
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        # OSError: a name of a directory of the database (`Europe`: IsADirectoryError) or
        # longer than a file name may be (ENAMETOOLONG) is no zone either, not a 500.
        raise SpecError(message) from exc


def cron_times(cron: Cron, tz: ZoneInfo, after: datetime) -> Iterator[datetime]:
    """The fire times of `cron` in `tz` strictly after `after`, in UTC, in order."""
    local = after.astimezone(tz)
    day = local.date()
    end = day + timedelta(days=SEARCH_DAYS)
    while day < end:
        if day.month not in cron.months:
            # A month the cron does not name is passed whole: `0 0 29 2 *` reads the five
            # years' Februaries, not their 1 830 days (every schedule of a page shows its next
            # fire times, on the event loop).
            day = date(day.year + day.month // 12, day.month % 12 + 1, 1)
            continue
        if cron.matches_day(day):
            for hour in cron.hours:
                for minute in cron.minutes:
                    wall = datetime.combine(day, time(hour, minute), tzinfo=tz)
                    # A wall time a DST change skips maps to another local time: not this day.
                    round_trip = wall.astimezone(UTC).astimezone(tz)
                    if (round_trip.hour, round_trip.minute) != (hour, minute):
                        continue
                    at = wall.astimezone(UTC)
                    if at > after:
                        yield at
        day += timedelta(days=1)


def offset_changes(tz: ZoneInfo, after: datetime, days: int = 366) -> list[datetime]:
    """For each change of `tz`'s UTC offset (a daylight-saving change) in the `days` after
    `after`, an instant at most a day before it."""
    found: list[datetime] = []
    at, offset = after, after.astimezone(tz).utcoffset()
    for _ in range(days):
        following = at + timedelta(days=1)
        if (changed := following.astimezone(tz).utcoffset()) != offset:
            found.append(at)
            offset = changed
        at = following
    return found


def closest_gap_s(cron: Cron, tz: ZoneInfo, coming: list[datetime], after: datetime) -> float:
    """The seconds between the closest two of `coming` (the next fire times after `after`,
    two days of them at least) and of the fire times of the two days after a day before each
    daylight-saving change of the coming year: a day's pattern does not hold across one (Lord
    Howe's half-hour change brings two firings nearer than on any other day)."""
    runs = [coming]
    for at in offset_changes(tz, after):
        run: list[datetime] = []
        for fire in cron_times(cron, tz, at):
            if fire >= at + timedelta(days=2):
                break
            run.append(fire)
        runs.append(run)
    gaps = [(b - a).total_seconds() for run in runs for a, b in itertools.pairwise(run)]
    return min(gaps, default=math.inf)


def interval_times(every_s: int, after: datetime) -> Iterator[datetime]:
    """The multiples of `every_s` seconds since the epoch strictly after `after`, in UTC."""
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    n = int((after - epoch).total_seconds() // every_s) + 1
    while True:
        yield epoch + timedelta(seconds=n * every_s)
        n += 1


def next_times(
    *, cron: str | None, interval_s: int | None, timezone: str, after: datetime, count: int
) -> list[datetime]:
    """The next `count` fire times after `after` (UTC)."""
    times = (
        cron_times(parse_cron(cron), zone(timezone), after)
        if cron is not None
        else interval_times(interval_s or 0, after)
    )
    found: list[datetime] = []
    for at in times:
        found.append(at)
        if len(found) == count:
            break
    return found
