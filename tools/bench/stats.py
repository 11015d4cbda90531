"""The bench's pure statistics: percentiles, the spread of repetitions, paired ratios, and how
each is printed. Unit-tested (tests/unit/test_bench_stats.py); nothing here measures time."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

PERCENTILES = (50, 95, 99)


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0..100) with linear interpolation between closest ranks.

    The same definition as numpy's default (`linear`): rank `(n - 1) * q / 100` of the sorted
    values, interpolated. Raises `ValueError` on an empty sequence or a `q` outside 0..100.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = math.ceil(rank)
    if low == high:
        return float(ordered[low])
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_percentiles(values: Sequence[float]) -> dict[str, float]:
    """`{"p50", "p95", "p99"}` of `values`."""
    return {f"p{q}": percentile(values, q) for q in PERCENTILES}


@dataclass(frozen=True, slots=True)
class Spread:
    """The median of repetitions, with the lowest and highest beside it."""

    median: float
    low: float
    high: float
    n: int


def spread(values: Iterable[float]) -> Spread:
    """Median, min and max of the repetitions' values (ValueError when there are none)."""
    items = [float(v) for v in values]
    if not items:
        raise ValueError("spread of no repetitions")
    return Spread(statistics.median(items), min(items), max(items), len(items))


def paired_ratios(ours: Sequence[float], baseline: Sequence[float]) -> list[float]:
    """Per-repetition ratios `ours[i] / baseline[i]` (each pair ran back to back).

    Pairs whose baseline is zero are skipped; the sequences must be equally long.
    """
    if len(ours) != len(baseline):
        raise ValueError("ratios need as many baseline repetitions as measured ones")
    return [a / b for a, b in zip(ours, baseline, strict=True) if b]


def format_number(value: float) -> str:
    """Three significant figures at most, no exponent: 1234 → `1234`, 12.34 → `12.3`."""
    if not math.isfinite(value):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def format_spread(value: Spread) -> str:
    """`median (min–max)`, or the median alone when every repetition gave the same value."""
    if value.low == value.high:
        return format_number(value.median)
    return f"{format_number(value.median)} ({format_number(value.low)}–{format_number(value.high)})"


def format_ratio(value: float) -> str:
    """A ratio as `0.93×`."""
    return f"{value:.2f}×"


def format_ratio_spread(value: Spread) -> str:
    """A ratio's median with its min–max: `0.93× (0.88–0.97)`."""
    if value.low == value.high:
        return format_ratio(value.median)
    return f"{format_ratio(value.median)} ({value.low:.2f}–{value.high:.2f})"


def target_met(value: float, target: float, at_least: bool) -> bool:
    """Whether `value` meets the target: `value >= target` when `at_least`, else `<=`."""
    return value >= target if at_least else value <= target


def format_target(value: float, target: float, at_least: bool, unit: str = "×") -> str:
    """`met` or `MISSED`, followed by the target, e.g. `met (target ≥ 0.90×)`; a ratio missed
    by less than its two decimals show says by how much: `MISSED by 0.00005 (target ≥ 0.50×)`."""
    sign = "≥" if at_least else "≤"
    verdict = "met" if target_met(value, target, at_least) else "MISSED"
    if verdict == "MISSED" and unit == "×" and f"{value:.2f}" == f"{target:.2f}":
        verdict += " by " + f"{abs(value - target):.6f}".rstrip("0")
    shown = f"{target:.2f}×" if unit == "×" else f"{format_number(target)} {unit}".rstrip()
    return f"{verdict} (target {sign} {shown})"
