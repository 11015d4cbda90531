"""The measured repetitions of each scenario, on Receipt and on its baselines, and the targets
read from their ratios (a report, never an assertion)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tools.bench.config import (
    TARGET_API_P99_RATIO,
    TARGET_API_RATE,
    TARGET_E2E_VS_ACTIVITY,
    TARGET_E2E_VS_CHILD,
    TARGET_ROUND_TRIPS,
    TARGET_SANDBOXED_P50,
    TARGET_SETTLED_P50,
)
from tools.bench.raw import SANDBOXED
from tools.bench.recovery import Recovery
from tools.bench.stats import Spread, latency_percentiles, paired_ratios, spread, target_met

# The sides of an end-to-end scenario besides Receipt (`ours`): `base` is the raw activity
# pipeline (the shape the targets compare with), `child` the raw child-workflow pipeline.
CHILD = "child"
# Receipt's no-op job (`config.NO_HANDLER_AGENT`): its runs are the `ours` of the scenario's
# `<name>-bare` pair, whose `base` is the same raw activity runs.
BARE = "bare"
SUBJECT = "codex `true`"
BARE_SUBJECT = "a job with no handler (no-op)"


@dataclass
class Run:
    """One repetition of one scenario: a rate and latency samples in milliseconds."""

    rate: float
    samples: dict[str, list[float]]
    cpu_ms_per_item: dict[str, float] = field(default_factory=dict)
    count: int = 0
    failed: int = 0
    unsettled: int = 0

    def percentiles(self) -> dict[str, dict[str, float]]:
        return {name: latency_percentiles(v) for name, v in self.samples.items() if v}

    def to_json(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "count": self.count,
            "failed": self.failed,
            "unsettled": self.unsettled,
            "percentilesMs": self.percentiles(),
            "cpuMsPerItem": {k: round(v, 3) for k, v in self.cpu_ms_per_item.items()},
            "samplesMs": {k: [round(x, 2) for x in v] for k, v in self.samples.items()},
        }


@dataclass
class Pair:
    """Repetitions of a scenario measured on Receipt (`ours`), on its baseline (`base`) and on
    further baselines (`others`, by side name), back to back within each repetition."""

    name: str
    title: str
    ours: list[Run] = field(default_factory=list)
    base: list[Run] = field(default_factory=list)
    others: dict[str, list[Run]] = field(default_factory=dict)
    # What Receipt ran in this scenario, as the table names it.
    subject: str = SUBJECT

    def sides(self) -> list[str]:
        """`base` and the other baselines that have repetitions."""
        return ["base", *[name for name, runs in self.others.items() if runs]]

    def runs(self, side: str) -> list[Run]:
        if side == "ours":
            return self.ours
        if side == "base":
            return self.base
        return self.others.setdefault(side, [])

    def complete(self) -> bool:
        return bool(self.ours and self.base)

    def rate(self, side: str) -> Spread:
        return spread(r.rate for r in self.runs(side))

    def latency(self, side: str, sample: str, key: str) -> Spread:
        return spread(r.percentiles()[sample][key] for r in self.runs(side))

    def rate_ratio(self, against: str = "base") -> Spread:
        baseline = [r.rate for r in self.runs(against)]
        return spread(paired_ratios([r.rate for r in self.ours], baseline))

    def latency_ratio(self, sample: str, key: str, against: str = "base") -> Spread:
        ours = [r.percentiles()[sample][key] for r in self.ours]
        base = [r.percentiles()[sample][key] for r in self.runs(against)]
        return spread(paired_ratios(ours, base))

    def cpu(self, side: str) -> dict[str, Spread]:
        runs = self.runs(side)
        names = sorted({k for r in runs for k in r.cpu_ms_per_item})
        return {n: spread(r.cpu_ms_per_item.get(n, 0.0) for r in runs) for n in names}

    def to_json(self) -> dict[str, Any]:
        out = {
            "title": self.title,
            "subject": self.subject,
            "receipt": [r.to_json() for r in self.ours],
            "baseline": [r.to_json() for r in self.base],
        }
        for side, runs in self.others.items():
            out[side] = [r.to_json() for r in runs]
        return out


def summary(
    pairs: Mapping[str, Pair],
    recoveries: Sequence[Recovery] = (),
    round_trips: float | None = None,
) -> dict[str, Any]:
    """Medians with min–max, ratios and the targets, as JSON."""

    def s(value: Spread) -> dict[str, float]:
        return {"median": value.median, "min": value.low, "max": value.high}

    out: dict[str, Any] = {}
    for name, pair in pairs.items():
        if not pair.complete():
            continue
        entry: dict[str, Any] = {
            "title": pair.title,
            "subject": pair.subject,
            "rate": {"receipt": s(pair.rate("ours"))},
            "rateRatio": {},
            "latencyMs": {},
            "latencyRatio": {},
        }
        for side in pair.sides():
            label = "baseline" if side == "base" else side
            entry["rate"][label] = s(pair.rate(side))
            entry["rateRatio"][label] = s(pair.rate_ratio(side))
        for sample in pair.ours[0].samples:
            for key in ("p50", "p95", "p99"):
                figure = f"{sample}.{key}"
                entry["latencyMs"][figure] = {"receipt": s(pair.latency("ours", sample, key))}
                entry["latencyRatio"][figure] = {}
                for side in pair.sides():
                    label = "baseline" if side == "base" else side
                    entry["latencyMs"][figure][label] = s(pair.latency(side, sample, key))
                    entry["latencyRatio"][figure][label] = s(pair.latency_ratio(sample, key, side))
        out[name] = entry
    if recoveries:
        out["recovery"] = [r.to_json() for r in recoveries]
    out["targets"] = target_rows(pairs, recoveries, round_trips)
    return out


def target_rows(
    pairs: Mapping[str, Pair],
    recoveries: Sequence[Recovery] = (),
    round_trips: float | None = None,
) -> list[dict[str, Any]]:
    """The targets, each with the measured value (a median) and whether it is met."""
    rows: list[dict[str, Any]] = []

    def add(name: str, value: Spread, target: float, at_least: bool, unit: str = "×") -> None:
        rows.append(
            {
                "target": name,
                "value": value.median,
                "min": value.low,
                "max": value.high,
                "goal": target,
                "atLeast": at_least,
                "unit": unit,
                "met": target_met(value.median, target, at_least),
            }
        )

    # The end-to-end targets, read for codex `true` and for the no-op job (`-bare`) alike.
    for suffix, tag in (("", ""), (f"-{BARE}", ", no-op")):
        burn = pairs.get(f"burn{suffix}")
        if burn is not None and burn.complete():
            add(f"e2e jobs/s vs raw activity{tag}", burn.rate_ratio(), TARGET_E2E_VS_ACTIVITY, True)
            if burn.runs(CHILD):
                add(
                    f"e2e jobs/s vs raw child wf{tag}",
                    burn.rate_ratio(CHILD),
                    TARGET_E2E_VS_CHILD,
                    True,
                )
        stream = pairs.get(f"stream{suffix}")
        if stream is not None and stream.complete():
            add(
                f"settled p50 vs raw activity{tag} (stream)",
                stream.latency_ratio("settled", "p50"),
                TARGET_SETTLED_P50,
                False,
            )
            if not suffix and stream.runs(SANDBOXED):
                add(
                    "settled p50 vs raw activity + sandbox (stream)",
                    stream.latency_ratio("settled", "p50", SANDBOXED),
                    TARGET_SANDBOXED_P50,
                    False,
                )
    for name, pair in pairs.items():
        if name.startswith("api-") and pair.complete():
            clients = name.split("-", 1)[1]
            add(
                f"API enqueue vs raw append, {clients} c.", pair.rate_ratio(), TARGET_API_RATE, True
            )
    if "api-16" in pairs and pairs["api-16"].complete():
        add(
            "API p99 vs raw append p99, 16 c.",
            pairs["api-16"].latency_ratio("request", "p99"),
            TARGET_API_P99_RATIO,
            False,
        )
    if round_trips is not None:
        add(
            "PostgreSQL round trips per no-op job",
            Spread(round_trips, round_trips, round_trips, 1),
            TARGET_ROUND_TRIPS,
            False,
            "",
        )
    if recoveries:  # every kill of a run runs the same command, so one goal
        add(
            "kill → settled, worker SIGKILL",
            spread(r.settled_s for r in recoveries),
            recoveries[0].goal_s,
            False,
            "s",
        )
    return rows
