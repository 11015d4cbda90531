"""The pure statistics of the bench (`python -m tools.bench`): percentiles, repetitions,
ratios and their formatting.

Nothing here measures time: the bench reports figures, it never asserts them.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tools.bench.profile import profile_summary
from tools.bench.report import render_table
from tools.bench.results import BARE, BARE_SUBJECT, CHILD, Pair, Run, summary, target_rows
from tools.bench.stats import (
    Spread,
    format_number,
    format_ratio,
    format_ratio_spread,
    format_spread,
    format_target,
    latency_percentiles,
    paired_ratios,
    percentile,
    spread,
    target_met,
)

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


def test_percentile_interpolates_linearly_between_closest_ranks() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 25) == pytest.approx(1.75)
    assert percentile(values, 99) == pytest.approx(3.97)


def test_percentile_ignores_input_order_and_handles_one_value() -> None:
    assert percentile([9.0, 1.0, 5.0], 50) == 5.0
    assert percentile([7.0], 99) == 7.0


def test_percentile_of_1_to_100_matches_the_nearest_rank_reading() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 95) == pytest.approx(95.05)
    assert percentile(values, 99) == pytest.approx(99.01)


def test_percentile_refuses_no_values_and_a_q_out_of_range() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], 101)
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], -1)


@given(st.lists(finite, min_size=1, max_size=50), st.floats(0, 100), st.floats(0, 100))
def test_percentile_is_monotonic_in_q_and_within_the_range(
    values: list[float], q1: float, q2: float
) -> None:
    low, high = sorted((q1, q2))
    assert min(values) <= percentile(values, low) <= percentile(values, high) <= max(values)


def test_latency_percentiles_names_p50_p95_p99() -> None:
    values = [float(v) for v in range(1, 101)]
    result = latency_percentiles(values)
    assert list(result) == ["p50", "p95", "p99"]
    assert result["p50"] == pytest.approx(50.5)


def test_spread_is_the_median_with_min_and_max() -> None:
    assert spread([3.0, 1.0, 2.0]) == Spread(2.0, 1.0, 3.0, 3)
    assert spread([4.0, 1.0, 2.0, 3.0]) == Spread(2.5, 1.0, 4.0, 4)
    assert spread([5]) == Spread(5.0, 5.0, 5.0, 1)
    with pytest.raises(ValueError, match="no repetitions"):
        spread([])


@given(st.lists(finite, min_size=1, max_size=30))
def test_spread_median_lies_between_min_and_max(values: list[float]) -> None:
    result = spread(values)
    assert result.low <= result.median <= result.high
    assert result.n == len(values)


def test_paired_ratios_divide_each_repetition_by_its_baseline() -> None:
    assert paired_ratios([10.0, 9.0], [20.0, 10.0]) == [0.5, 0.9]


def test_paired_ratios_skip_a_zero_baseline_and_refuse_unequal_lengths() -> None:
    assert paired_ratios([1.0, 2.0], [0.0, 4.0]) == [0.5]
    with pytest.raises(ValueError, match="as many"):
        paired_ratios([1.0], [1.0, 2.0])


def test_format_number_keeps_three_significant_figures_at_most() -> None:
    assert format_number(1234.5) == "1234"
    assert format_number(123.45) == "123"
    assert format_number(12.345) == "12.3"
    assert format_number(1.2345) == "1.23"
    assert format_number(0.12345) == "0.123"
    assert format_number(math.inf) == "inf"


def test_format_spread_shows_median_then_min_and_max() -> None:
    assert format_spread(Spread(412.0, 398.0, 430.0, 5)) == "412 (398–430)"
    assert format_spread(Spread(3.5, 3.5, 3.5, 1)) == "3.50"


def test_ratio_formatting() -> None:
    assert format_ratio(0.934) == "0.93×"
    assert format_ratio(1.2) == "1.20×"
    assert format_ratio_spread(Spread(0.93, 0.88, 0.97, 5)) == "0.93× (0.88–0.97)"
    assert format_ratio_spread(Spread(1.0, 1.0, 1.0, 1)) == "1.00×"


def test_targets_at_least_and_at_most() -> None:
    assert target_met(0.9, 0.9, at_least=True)
    assert not target_met(0.89, 0.9, at_least=True)
    assert target_met(1.2, 1.2, at_least=False)
    assert not target_met(1.21, 1.2, at_least=False)
    assert format_target(0.95, 0.9, True) == "met (target ≥ 0.90×)"
    assert format_target(1.5, 1.2, False) == "MISSED (target ≤ 1.20×)"
    assert format_target(30.0, 25.0, False, "ms") == "MISSED (target ≤ 25.0 ms)"
    # A miss the two decimals hide (0.49995 shows as 0.50×) says by how much.
    assert format_target(0.49995, 0.5, True) == "MISSED by 0.00005 (target ≥ 0.50×)"
    assert format_target(1.2004, 1.2, False) == "MISSED by 0.0004 (target ≤ 1.20×)"


def _run(rate: float, settled: list[float]) -> Run:
    return Run(rate, {"started": settled, "settled": settled})


def test_pair_ratios_are_medians_of_back_to_back_repetitions() -> None:
    pair = Pair("burn", "burn-down")
    pair.ours = [_run(9.0, [10.0, 20.0]), _run(8.0, [12.0, 24.0]), _run(10.0, [11.0, 22.0])]
    pair.base = [_run(10.0, [10.0, 10.0]), _run(10.0, [12.0, 12.0]), _run(10.0, [11.0, 11.0])]
    assert pair.rate("ours") == Spread(9.0, 8.0, 10.0, 3)
    assert pair.rate_ratio() == Spread(pytest.approx(0.9), 0.8, 1.0, 3)
    ratio = pair.latency_ratio("settled", "p50")
    assert ratio.median == pytest.approx(1.5)
    assert ratio.low == ratio.high == pytest.approx(1.5)


def test_target_rows_read_the_four_targets_from_the_pairs() -> None:
    burn = Pair("burn", "burn-down")
    burn.ours, burn.base = [_run(9.5, [1.0])], [_run(10.0, [1.0])]
    stream = Pair("stream", "stream")
    stream.ours, stream.base = [_run(5.0, [130.0])], [_run(5.0, [100.0])]
    api = Pair("api-16", "API")
    api.ours = [Run(400.0, {"request": [float(v) for v in range(1, 31)]})]
    api.base = [Run(1000.0, {"request": [1.0]})]
    rows = {
        row["target"]: row for row in target_rows({"burn": burn, "stream": stream, "api-16": api})
    }
    assert rows["e2e jobs/s vs raw activity"]["met"] is True
    assert "e2e jobs/s vs raw child wf" not in rows  # no child pipeline measured
    assert rows["settled p50 vs raw activity (stream)"]["value"] == pytest.approx(1.3)
    assert rows["settled p50 vs raw activity (stream)"]["met"] is False
    assert rows["API enqueue vs raw append, 16 c."]["value"] == pytest.approx(0.4)
    assert rows["API enqueue vs raw append, 16 c."]["goal"] == 0.6
    assert rows["API p99 vs raw append p99, 16 c."]["value"] == pytest.approx(
        30.0 * 0.99 / 1.0, rel=0.05
    )
    assert rows["API p99 vs raw append p99, 16 c."]["met"] is False


def test_profile_summary_leaves_idle_samples_out() -> None:
    collapsed = [
        "main (app.py:1);select (selectors.py:468) 50",
        "main (app.py:1);execute (psycopg/cursor.py:10) 30",
        "main (app.py:1);dumps (json/__init__.py:3) 10",
        "garbage line",
    ]
    result = profile_summary(collapsed)
    assert result["busy"] == [("busy", pytest.approx(40 / 90))]
    assert result["self"][0] == ("psycopg", pytest.approx(0.75))
    assert ("main (app.py:1)", pytest.approx(1.0)) in result["inclusive"]
    # Where the CPU itself went, by function (the line folded away).
    assert result["functions"][0] == ("execute (psycopg/cursor.py)", pytest.approx(0.75))


def test_the_child_pipeline_is_a_second_baseline_with_its_own_ratio_and_target() -> None:
    burn = Pair("burn", "burn-down")
    burn.ours = [_run(9.0, [10.0]), _run(12.0, [10.0])]
    burn.base = [_run(10.0, [5.0]), _run(10.0, [5.0])]
    burn.others[CHILD] = [_run(5.0, [20.0]), _run(6.0, [20.0])]
    assert burn.sides() == ["base", CHILD]
    assert burn.rate_ratio() == Spread(pytest.approx(1.05), pytest.approx(0.9), 1.2, 2)
    assert burn.rate_ratio(CHILD) == Spread(pytest.approx(1.9), pytest.approx(1.8), 2.0, 2)
    assert burn.latency_ratio("settled", "p50", CHILD).median == pytest.approx(0.5)
    rows = {row["target"]: row for row in target_rows({"burn": burn})}
    assert rows["e2e jobs/s vs raw activity"]["goal"] == 0.9
    assert rows["e2e jobs/s vs raw child wf"]["value"] == pytest.approx(1.9)
    assert rows["e2e jobs/s vs raw child wf"]["met"] is True  # target ≥ 1.8×


def test_the_no_op_job_is_read_against_the_same_raw_runs_with_targets_of_its_own() -> None:
    burn = Pair("burn", "burn-down")
    burn.ours = [_run(6.0, [10.0])]
    burn.base = [_run(10.0, [5.0])]
    burn.others[CHILD] = [_run(5.0, [20.0])]
    # As the bench builds it: the `-bare` pair shares the raw runs of its scenario.
    bare = Pair(f"burn-{BARE}", "burn-down", base=burn.base, subject=BARE_SUBJECT)
    bare.others[CHILD] = burn.runs(CHILD)
    bare.ours = [_run(8.0, [7.0])]
    pairs = {"burn": burn, bare.name: bare}
    rows = {row["target"]: row for row in target_rows(pairs)}
    assert rows["e2e jobs/s vs raw activity"]["value"] == pytest.approx(0.6)
    assert rows["e2e jobs/s vs raw activity, no-op"]["value"] == pytest.approx(0.8)
    assert rows["e2e jobs/s vs raw child wf, no-op"]["value"] == pytest.approx(1.6)
    assert rows["e2e jobs/s vs raw child wf, no-op"]["met"] is False  # target ≥ 1.8×
    assert rows["e2e jobs/s vs raw activity, no-op"]["met"] is False
    report = {
        "config": {"mode": "quick", "repetitions": 1, "api_requests": 0},
        "stamp": "t",
        "machine": {"cpus": 2},
        "durationS": 1.0,
        "summary": summary(pairs),
    }
    table = render_table(report, pairs)
    assert "End to end, burn-down: codex `true` vs raw Temporal pipelines" in table
    assert f"End to end, burn-down: {BARE_SUBJECT} vs raw Temporal pipelines" in table


def test_the_round_trips_per_no_op_job_are_a_target_of_their_own() -> None:
    met, missed = (target_rows({}, [], trips)[0] for trips in (9.6, 11.3))
    assert met["target"] == "PostgreSQL round trips per no-op job"
    assert (met["goal"], met["atLeast"], met["met"]) == (10.0, False, True)
    assert (missed["value"], missed["met"]) == (11.3, False)
