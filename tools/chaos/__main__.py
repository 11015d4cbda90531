"""`python -m tools.chaos`: run the chaos soak; exit 0 only when every invariant holds."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

from tools.chaos.hostile import hostile
from tools.chaos.plan import FAULT_KINDS, ChaosConfig
from tools.chaos.run import chaos

PARTS = ("all", "soak", "hostile")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--duration",
    type=float,
    default=600.0,
    show_default=True,
    help="Seconds of load (faults land between 10 % and 80 % of it).",
)
@click.option(
    "--rate", type=float, default=2.0, show_default=True, help="Jobs enqueued per second."
)
@click.option(
    "--seed", type=int, default=1, show_default=True, help="Seed of the fault schedule and mix."
)
@click.option(
    "--fault",
    "faults",
    multiple=True,
    type=click.Choice(list(FAULT_KINDS)),
    help="Inject only these kinds (repeatable; default: all seven).",
)
@click.option(
    "--per-kind",
    type=int,
    default=None,
    help="Times each kind is injected (default: one per 300 s of load, at least 1).",
)
@click.option(
    "--drain-timeout",
    type=float,
    default=300.0,
    show_default=True,
    help="Seconds to wait for the queue to drain after the load.",
)
@click.option(
    "--part",
    type=click.Choice(PARTS),
    default="all",
    show_default=True,
    help="The fault soak, the hostile tenant, or both (the soak first, each on its own stack).",
)
@click.option(
    "--hostile-duration",
    type=float,
    default=120.0,
    show_default=True,
    help="Seconds of each hostile-tenant phase (organization A alone, then beside B's flood).",
)
@click.option(
    "--hostile-rate",
    type=float,
    default=3.0,
    show_default=True,
    help="Organization A's jobs per second in both hostile-tenant phases.",
)
@click.option(
    "--keep",
    type=click.Path(path_type=Path),
    default=None,
    help="Keep data and logs in this directory (default: a temporary one, removed on success).",
)
def main(
    duration: float,
    rate: float,
    seed: int,
    faults: tuple[str, ...],
    per_kind: int | None,
    drain_timeout: float,
    part: str,
    hostile_duration: float,
    hostile_rate: float,
    keep: Path | None,
) -> None:
    """Run real role processes under load while injecting faults; verify the receipt chain.

    Faults: SIGKILL of a worker (restarted), SIGKILL of the driver (at random, and while its
    agent-job dispatcher holds an agent's slot lock), SIGKILL of the api mid-request, SIGSTOP of
    a worker past its lease then SIGCONT, a PostgreSQL restart (embedded server only), a Temporal dev server
    restart, and a poison job that kills its worker every attempt. Prints one line per
    invariant, the fault timeline with recovery times and the summary.

    Then the hostile tenant, on a stack of its own with real sandboxes: organization A's steady
    mix alone, then again while organization B floods enqueues past its rate limit, holds its
    most event streams, posts bodies at and past the cap and runs commands against every
    sandbox limit. Prints A's latencies in both phases with their ratios, B's answers by status
    and the peak memory. Exits 0 only when every invariant holds, no 5xx was answered and
    every one of A's jobs settled.
    """
    config = ChaosConfig(
        duration_s=duration,
        rate=rate,
        seed=seed,
        faults=faults or FAULT_KINDS,
        per_kind=per_kind,
        drain_timeout_s=drain_timeout,
        keep_dir=keep,
    )
    code = 0
    if part in ("all", "soak"):
        code |= asyncio.run(chaos(config))
    if part in ("all", "hostile"):
        phase = ChaosConfig(duration_s=hostile_duration, seed=seed, keep_dir=keep)
        code |= asyncio.run(hostile(phase, a_rate=hostile_rate))
    sys.exit(code)


if __name__ == "__main__":
    main()
