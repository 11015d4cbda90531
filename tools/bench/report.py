"""What a bench run prints and draws: the table (one block per scenario: Receipt, each baseline
and the ratio against it, each a median with its min–max) and a PNG of the distributions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tools.bench.raw import SANDBOXED
from tools.bench.results import BARE, CHILD, Pair, Run
from tools.bench.stats import (
    Spread,
    format_number,
    format_ratio_spread,
    format_spread,
    format_target,
    percentile,
)

_KEYS = ("p50", "p95", "p99")
# What each side of an end-to-end scenario is called in the table and the chart.
E2E_LABELS = {
    "ours": "Receipt",
    "base": "raw activity",
    SANDBOXED: "raw act. + sandbox",
    CHILD: "raw child wf",
}


def _row(label: str, *cells: str) -> str:
    return f"  {label:<26}" + "".join(f"{c:<20}" for c in cells).rstrip()


def _cells(pair: Pair, sample: str | None = None, key: str = "") -> list[str]:
    """Receipt's figure, then each baseline's and Receipt's ratio to it: the rate, or the
    `key` percentile of `sample` latencies."""

    def value(side: str) -> Spread:
        return pair.rate(side) if sample is None else pair.latency(side, sample, key)

    def ratio(side: str) -> Spread:
        return pair.rate_ratio(side) if sample is None else pair.latency_ratio(sample, key, side)

    cells = [format_spread(value("ours"))]
    for side in pair.sides():
        cells += [format_spread(value(side)), format_ratio_spread(ratio(side))]
    return cells


def render_table(report: Mapping[str, Any], pairs: Mapping[str, Pair]) -> str:
    """The table `python -m tools.bench` prints (and tools/bench/README.md quotes)."""
    cfg = report["config"]
    lines = [
        f"receipt bench ({cfg['mode']}, {report['stamp']}): median (min–max) of "
        f"{cfg['repetitions']} repetitions; {report['machine']['cpus']} cores; "
        f"{report['durationS']:.0f} s",
    ]
    for name, pair in pairs.items():
        if not pair.complete():
            continue
        api = name.startswith("api-")
        lines.append("")
        if api:
            lines.append(
                f"{pair.title}: POST /agents/codex/jobs ×{cfg['api_requests']} "
                "vs the raw enqueue transaction"
            )
            lines.append(_row("", "API", "raw append", "ratio"))
            rate_label = "requests/s"
            samples: tuple[tuple[str, str], ...] = (("request", "latency"),)
        else:
            lines.append(f"End to end, {pair.title}: {pair.subject} vs raw Temporal pipelines")
            header = ["Receipt"]
            for side in pair.sides():
                header += [E2E_LABELS.get(side, side), "ratio"]
            lines.append(_row("", *header))
            rate_label = "jobs/s"
            samples = (("started", "enqueue→started"), ("settled", "enqueue→settled"))
        lines.append(_row(rate_label, *_cells(pair)))
        for sample, label in samples:
            for key in _KEYS:
                lines.append(_row(f"{label} {key} ms", *_cells(pair, sample, key)))
        unit = "request" if api else "job"
        every = [r for side in ("ours", *pair.sides()) for r in pair.runs(side)]
        failed = sum(r.failed for r in every)
        unsettled = sum(r.unsettled for r in every)
        if failed or unsettled:
            lines.append(
                f"  note: {failed} {unit}s failed and {unsettled} did not settle in time "
                "(left out of the latencies)"
            )
        for side in ("ours", *pair.sides()):
            label = ("API" if side == "ours" else "raw append") if api else E2E_LABELS[side]
            cpu = sorted(pair.cpu(side).items(), key=lambda kv: -kv[1].median)
            parts = ", ".join(f"{k} {format_number(v.median)}" for k, v in cpu if v.high > 0)
            lines.append(f"  CPU ms per {unit}, {label}: {parts}")
    lines += recovery_lines(report["summary"].get("recovery", []))
    lines.append("")
    lines.append("Targets (read from the ratios, never asserted)")
    for row in report["summary"]["targets"]:
        value = Spread(row["value"], row["min"], row["max"], 0)
        unit = row["unit"]
        shown = format_ratio_spread(value) if unit == "×" else f"{format_spread(value)} {unit}"
        verdict = format_target(row["value"], row["goal"], row["atLeast"], row["unit"])
        lines.append(f"  {row['target']:<44} {shown:<22} {verdict}")
    return "\n".join(lines)


def recovery_lines(recoveries: Sequence[Mapping[str, Any]]) -> list[str]:
    """The recovery block: each SIGKILL of worker-codex and what the job's chain says."""
    if not recoveries:
        return []
    first = recoveries[0]
    lines = [
        "",
        f"Recovery: worker-codex SIGKILLed {len(recoveries)}× mid-command (`sleep "
        f"{first['run_s']:g}`, default leases) and started again at once",
        _row("", "kill → takeover", "kill → settled", "settles", "attempt/delivery"),
    ]
    for i, r in enumerate(recoveries, 1):
        lines.append(
            _row(
                f"kill {i}",
                f"{r['takeover_s']:.1f} s",
                f"{r['settled_s']:.1f} s",
                f"{r['settles']} ({r['status']})",
                str(r["taken_over_by"]).rsplit(":", 1)[-1],
            )
        )
    return lines


def render_chart(pairs: Mapping[str, Pair], path: Path, title: str) -> None:
    """A PNG: latency distributions (CDFs on a log time axis, every repetition pooled) for the
    API and the two end-to-end scenarios (codex `true` and the no-op job), and the CPU each
    process spent per burn-down job."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    fig, axes = plt.subplots(2, 2, figsize=(14, 9.5), dpi=110)
    ours_colour, base_colour = "#c2410c", "#1d4ed8"
    bare_colour = "#ca8a04"
    colours = {"ours": ours_colour, "base": base_colour, SANDBOXED: "#7c3aed", CHILD: "#15803d"}

    def cdf(ax: Any, values: Sequence[float], label: str, colour: str, style: str = "-") -> None:
        if not values:
            return
        ordered = sorted(values)
        n = len(ordered)
        p50, p99 = percentile(ordered, 50), percentile(ordered, 99)
        label = f"{label}  (p50 {format_number(p50)}, p99 {format_number(p99)})"
        ax.step(ordered, [(i + 1) / n for i in range(n)], style, color=colour, label=label, lw=1.6)

    def pooled(runs: Sequence[Run], sample: str) -> list[float]:
        return [v for r in runs for v in r.samples.get(sample, [])]

    ax = axes[0][0]
    for name, pair in pairs.items():
        if not name.startswith("api-"):
            continue
        clients = name.split("-", 1)[1]
        style = ":" if clients == "1" else "-"
        cdf(ax, pooled(pair.ours, "request"), f"API, {clients} client(s)", ours_colour, style)
        cdf(ax, pooled(pair.base, "request"), f"raw append, {clients}", base_colour, style)
    ax.set_title("API enqueue: request latency (ms)")
    ax.set_visible(any(name.startswith("api-") for name in pairs))  # not with --part e2e
    for name, ax in (("burn", axes[0][1]), ("stream", axes[1][0])):
        e2e = pairs.get(name)
        if e2e is None:
            ax.set_visible(False)
            continue
        cdf(ax, pooled(e2e.ours, "settled"), "Receipt enqueue→settled", ours_colour)
        cdf(ax, pooled(e2e.ours, "started"), "Receipt enqueue→leased", ours_colour, "--")
        bare = pairs.get(f"{name}-{BARE}")
        if bare is not None:
            cdf(ax, pooled(bare.ours, "settled"), "Receipt no-op enqueue→settled", bare_colour)
            cdf(ax, pooled(bare.ours, "started"), "Receipt no-op enqueue→leased", bare_colour, "--")
        for side in e2e.sides():
            runs, label, colour = e2e.runs(side), E2E_LABELS[side], colours[side]
            cdf(ax, pooled(runs, "settled"), f"{label} start→activity end", colour)
            cdf(ax, pooled(runs, "started"), f"{label} start→activity start", colour, "--")
        ax.set_title(f"End to end, {e2e.title} (ms)")
    plain = FuncFormatter(lambda x, _: f"{x:g}")
    for ax in (axes[0][0], axes[0][1], axes[1][0]):
        if not ax.get_visible():
            continue
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda x, _: ""))
        ax.set_xlabel("milliseconds (log scale)")
        ax.set_ylabel("fraction at or below")
        ax.set_ylim(0, 1.02)
        for q in (0.5, 0.95, 0.99):
            ax.axhline(q, color="#d4d4d4", lw=0.6, zorder=0)
        ax.grid(True, which="major", axis="x", color="#e5e5e5", lw=0.6)
        ax.legend(loc="lower right", fontsize=7.5)

    ax = axes[1][1]
    burn = pairs.get("burn")
    if burn is not None and burn.complete():
        sides = ["ours", *burn.sides()]
        per_side = [burn.cpu(side) for side in sides]
        labels = [E2E_LABELS[side] for side in sides]
        bare = pairs.get(f"burn-{BARE}")
        if bare is not None and bare.complete():
            per_side.insert(1, bare.cpu("ours"))
            labels[0:1] = ["Receipt, true", "Receipt no-op"]
        zero = Spread(0.0, 0.0, 0.0, 0)
        components = sorted(
            {k for cpu in per_side for k in cpu},
            key=lambda k: -max(cpu.get(k, zero).median for cpu in per_side),
        )
        bottom = [0.0] * len(per_side)
        palette = plt.get_cmap("tab10")
        for i, name in enumerate(components):
            values = [cpu.get(name, zero).median for cpu in per_side]
            ax.bar(
                labels,
                values,
                bottom=bottom,
                label=name,
                color=palette(i % 10),
                width=0.45,
            )
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        for x, total in enumerate(bottom):
            ax.text(x, total, f"{format_number(total)} ms", ha="center", va="bottom", fontsize=9)
        ax.tick_params(axis="x", labelrotation=15)
        ax.set_title(f"CPU per job by process, {burn.title}")
        ax.set_ylabel("CPU milliseconds per job (median repetition)")
        ax.set_ylim(0, max(bottom) * 1.15 or 1)
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    else:
        ax.set_visible(False)
    fig.suptitle(f"{title}: curves pool every repetition (the table gives the median one)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
