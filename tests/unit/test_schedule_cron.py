"""Schedules' cron expressions and intervals: what is refused and why, and the next fire times
(time zones, daylight-saving changes, both day fields)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from receipts.schedules.cron import SpecError, next_times, parse_cron, parse_interval

T0 = datetime(2026, 12, 4, 17, 3, 20, tzinfo=UTC)  # a Friday


def times(expression: str, after: datetime = T0, tz: str = "UTC", count: int = 3) -> list[str]:
    found = next_times(cron=expression, interval_s=None, timezone=tz, after=after, count=count)
    return [t.strftime("%Y-%m-%d %H:%M") for t in found]


@pytest.mark.parametrize(
    ("expression", "said"),
    [
        ("* * * *", "has 4 fields"),
        ("60 * * * *", "minute: 60 is out of range 0-59"),
        ("* 24 * * *", "hour: 24 is out of range 0-23"),
        ("* * 0 * *", "day of month: 0 is out of range 1-31"),
        ("* * * 13 *", "month: 13 is out of range 1-12"),
        ("* * * * 8", "day of week: 8 is out of range 0-7"),
        ("*/0 * * * *", "minute: step '0' is not a positive number"),
        ("5-1 * * * *", "minute: range '5-1' runs backwards"),
        ("a * * * *", "minute: 'a' is not a value (0-59)"),
        ("* * * foo *", "month: 'foo' is not a value (1-12 or jan-dec)"),
        ("1,,2 * * * *", "minute: an empty list item"),
        # Digits of other scripts and numbers of any length are refused as values, not a 500.
        ("\u00b2 * * * *", "minute: '\u00b2' is not a value (0-59)"),
        ("*/\u00b2 * * * *", "minute: step '\u00b2' is not a positive number"),
        ("1" * 5000 + " * * * *", "is not a value (0-59)"),
        ("*/" + "9" * 5000 + " * * * *", "is not a positive number"),
    ],
)
def test_a_bad_cron_expression_is_refused_naming_the_field(expression: str, said: str) -> None:
    with pytest.raises(SpecError, match=said.replace("(", r"\(").replace(")", r"\)")):
        parse_cron(expression)


@pytest.mark.parametrize("text", ["\u00b2m", "0x10s", "1.5h"])
def test_an_interval_of_any_other_shape_is_refused_as_one(text: str) -> None:
    with pytest.raises(SpecError, match="is not an interval"):
        parse_interval(text, 1)


def test_an_interval_of_five_thousand_digits_is_too_long_not_a_500() -> None:
    with pytest.raises(SpecError, match="longer than the longest interval allowed"):
        parse_interval("1" * 5000 + "s", 1)


def test_steps_ranges_lists_names_and_macros() -> None:
    assert times("*/15 * * * *") == ["2026-12-04 17:15", "2026-12-04 17:30", "2026-12-04 17:45"]
    assert times("0 9-17/4 * * mon-fri") == [
        "2026-12-07 09:00",
        "2026-12-07 13:00",
        "2026-12-07 17:00",
    ]
    assert times("30 6 1,15 jan *", count=2) == ["2027-01-01 06:30", "2027-01-15 06:30"]
    assert times("@daily", count=1) == ["2026-12-05 00:00"]
    assert times("0 0 * * 7", count=1) == times("0 0 * * sun", count=1) == ["2026-12-06 00:00"]


def test_both_day_fields_restricted_match_either_day() -> None:
    # the 13th, or any Friday
    assert times("0 12 13 * fri", count=3) == [
        "2026-12-11 12:00",
        "2026-12-13 12:00",
        "2026-12-18 12:00",
    ]


def test_a_time_zone_shifts_the_fire_times_and_dst_skips_a_missing_hour() -> None:
    assert times("0 9 * * *", tz="Europe/Paris", count=1) == ["2026-12-05 08:00"]
    # 2027-03-28 02:30 does not exist in Paris (clocks go 02:00 -> 03:00): that day has none.
    after = datetime(2027, 3, 26, 12, 0, tzinfo=UTC)
    assert times("30 2 * * *", after=after, tz="Europe/Paris", count=3) == [
        "2027-03-27 01:30",
        "2027-03-29 00:30",
        "2027-03-30 00:30",
    ]


def test_an_impossible_date_matches_nothing() -> None:
    assert times("0 0 30 2 *") == []


def test_intervals_fire_on_multiples_since_the_epoch_and_have_a_floor() -> None:
    found = next_times(cron=None, interval_s=300, timezone="UTC", after=T0, count=2)
    assert [t.strftime("%H:%M:%S") for t in found] == ["17:05:00", "17:10:00"]
    assert parse_interval("15m", 60) == 900
    assert parse_interval("2h", 60) == 7200
    with pytest.raises(SpecError, match="shorter than the shortest interval allowed, 60 s"):
        parse_interval("30s", 60)
    with pytest.raises(SpecError, match="is not an interval"):
        parse_interval("5 minutes", 60)
    assert parse_interval("366d", 60) == 366 * 86_400
    for huge in ("367d", "300000000000s", "100000000000000s"):
        with pytest.raises(SpecError, match="longer than the longest interval allowed"):
            parse_interval(huge, 60)


@pytest.mark.parametrize(
    "name",
    [
        "localtime",
        "posixrules",
        "Factory",
        "posix/Europe/Paris",
        "right/UTC",
        "Mars/Base",
        "Europe",  # a directory of the database (IsADirectoryError: was a 500)
        "America/Argentina",
        "Europe/" + "x" * 300,  # longer than a file name (ENAMETOOLONG: was a 500)
    ],
)
def test_a_zone_no_schedule_can_mean_is_refused(name: str) -> None:
    """The zone database answers `localtime` (the reading host's own zone: the api, the sync
    and Temporal could disagree) and its `posix/`, `right/` variants, which Temporal's server
    may not know — the schedule was accepted and then never written to Temporal."""
    from receipts.schedules.cron import SpecError, zone

    with pytest.raises(SpecError, match="is not an IANA time zone"):
        zone(name)
    assert zone("Europe/Paris").key == "Europe/Paris"


def test_a_rare_cron_reads_only_the_months_it_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every schedule of a page shows its next fire times, on the event loop: `0 0 29 2 *`
    (one leap day in four years) walked all 1 830 days of its five-year search, about 2 ms a
    schedule, 200 ms a page of a hundred. Months it does not name are passed whole."""
    from receipts.schedules.cron import Cron

    checked: list[object] = []
    matches_day = Cron.matches_day
    monkeypatch.setattr(
        Cron, "matches_day", lambda self, day: checked.append(day) or matches_day(self, day)
    )
    assert times("0 0 29 2 *", count=5) == ["2028-02-29 00:00"]
    assert len(checked) <= 5 * 29
    checked.clear()
    assert times("0 0 1 1 *", count=2) == ["2027-01-01 00:00", "2028-01-01 00:00"]
    assert len(checked) <= 2 * 31
