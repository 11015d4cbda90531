"""The `receipt` command: database administration and the one-command stack."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import click

from receipts.projections import rebuild, verify
from receipts.settings import Settings
from roles.db import migrate_url, open_store, resolve_url


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Receipt: a durable background-job runtime for AI agents.

    The database is RECEIPT_DATABASE_URL, or an embedded PostgreSQL under RECEIPT_DATA_DIR
    (default ./.receipt) when it is unset.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")


@main.command("migrate")
def migrate_command() -> None:
    """Apply pending schema migrations (idempotent) and print what was applied."""
    applied = asyncio.run(migrate_url(resolve_url()))
    click.echo(f"migrations applied: {applied or 'none (schema up to date)'}")


@main.command("rebuild-projections")
@click.option("--verify-only", is_flag=True, help="Only compare; print differences, write nothing.")
def rebuild_projections_command(verify_only: bool) -> None:
    """Rebuild the jobs projection from the receipt chain (or verify it with --verify-only).

    Exits 1 when --verify-only finds a difference.
    """

    async def run() -> int:
        url = resolve_url()
        await migrate_url(url)
        store = await open_store(url)
        try:
            if verify_only:
                problems = await verify(store)
                for line in problems:
                    click.echo(line)
                click.echo(f"projection differences: {len(problems)}")
                return 1 if problems else 0
            count = await rebuild(store)
            click.echo(f"jobs projection rebuilt from the chain: {count} jobs")
            return 0
        finally:
            await store.close()

    sys.exit(asyncio.run(run()))


@main.command("up")
def up_command() -> None:
    """Start the stack on embedded defaults: PostgreSQL (unless RECEIPT_DATABASE_URL), migrate.

    Runs until Ctrl-C.
    """
    settings = Settings()
    url = resolve_url(settings)
    applied = asyncio.run(migrate_url(url))
    click.echo(f"database: {url}")
    click.echo(f"migrations applied: {applied or 'none (schema up to date)'}")
    click.echo("receipt is up; press Ctrl-C to stop")
    signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    signal.sigwait(signals)
    click.echo("stopping")


from roles.client import register  # noqa: E402 - the HTTP commands join the group defined above

register(main)

if __name__ == "__main__":
    main()
