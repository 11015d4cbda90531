"""The `receipt` commands on jobs over the HTTP API: `enqueue`, `jobs ls|get|events|steer|
follow-up|abort|retry`, and `api` (serve it).

Exit status of every API command: 0 success; 1 the job ended failed or canceled (only
`enqueue --wait` waits for the end); 2 usage error; 3 the API refused the request (sent again
as it is, refused again); 4 it could not be reached, did not answer, was unavailable or at a
limit (the same command may succeed later); 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

import click

from receipt_client import segment
from receipts.jobs import LANES, SINGLETON_MODES, STATUSES
from receipts.kinds import KINDS
from roles.cli.client import (
    ApiClient,
    _api_options,
    _compact,
    _dump,
    _echo_receipt,
    _echo_view,
    _given,
    _job_path,
    _load_json,
    _summary,
    _wait,
    idempotency_key_option,
    printable,
)


@click.command("enqueue")
@click.argument("agent")
@click.option(
    "--kind",
    type=click.Choice(KINDS),
    help="Payload kind (may instead be given as `kind` inside --payload).",
)
@click.option(
    "--payload",
    "payload_source",
    metavar="JSON|@FILE|@-",
    help="The payload object: inline JSON, @file.json, or @- for stdin. Include authContext "
    "{userId, organizationId} for every kind but factory.objective.watchdog.",
)
@click.option("--job-id", help="Idempotency key: re-posting the same id returns the same job.")
@idempotency_key_option
@click.option("--lane", type=click.Choice(LANES), help="Lane (default collect).")
@click.option("--session-key", help="Session key the singleton mode acts on.")
@click.option(
    "--singleton-mode", type=click.Choice(SINGLETON_MODES), help="Singleton mode (default allow)."
)
@click.option("--max-attempts", type=int, help="Attempts before failing (default 2, clamped 1..8).")
@click.option(
    "--wait",
    is_flag=True,
    help="Follow the job with a live status line until it is terminal, then print it; exit 0 "
    "only if it completed (1 if it failed or was canceled).",
)
@_api_options
def enqueue_command(
    agent: str,
    kind: str | None,
    payload_source: str | None,
    job_id: str | None,
    idempotency_key: str | None,
    lane: str | None,
    session_key: str | None,
    singleton_mode: str | None,
    max_attempts: int | None,
    wait: bool,
    api_url: str,
    token: str | None,
    as_json: bool,
) -> None:
    """Enqueue a job for AGENT and print it (POST /agents/AGENT/jobs).

    Agent ids with handlers: the four built in (factory, factory-control, factory-monitor,
    codex) and those installed with the handler SDK (`receipt.handlers` entry points); any
    other id is accepted and its job fails with "No handler for agent" (unless the API is
    strict).

    Exit status: 0 accepted (with --wait: completed); 1 with --wait, the job failed or was
    canceled; 2 usage error; 3 the API refused the request; 4 it could not be reached, did not
    answer, was unavailable or at a limit (try again later).
    """
    payload = _load_json(payload_source, "--payload") if payload_source else {}
    if not isinstance(payload, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--payload")
    if kind is not None:
        if payload.get("kind") not in (None, kind):
            raise click.BadParameter(
                f"--kind {kind} but the payload says {payload['kind']}", param_hint="--kind"
            )
        payload = {**payload, "kind": kind}
    elif "kind" not in payload:
        raise click.UsageError("give --kind, or a `kind` in --payload")
    options = {
        "jobId": job_id,
        "lane": lane,
        "sessionKey": session_key,
        "singletonMode": singleton_mode,
        "maxAttempts": max_attempts,
    }
    body = {"payload": payload, **_given(options)}
    if job_id is not None and idempotency_key is not None:
        raise click.UsageError("give --job-id or --idempotency-key, not both")
    # An id-less post carries a key of its own: one the API did not answer in time can be sent
    # again, and finds the job it made instead of making a second.
    key = None if job_id is not None else (idempotency_key or str(uuid.uuid4()))
    with ApiClient(api_url, token) as client:
        accepted = client.post_once(f"/agents/{segment(agent)}/jobs", body, key)
        job = accepted["job"]
        if accepted["async"].get("idempotencyMismatch") and not as_json:
            click.echo(
                printable(
                    f"warning: job {job['jobId']} exists with another agent or payload; it is "
                    "returned unchanged (use a new --job-id for a different job)"
                ),
                err=True,
            )
        if not wait:
            if as_json:
                click.echo(_dump(accepted))
            else:
                click.echo(
                    printable(
                        f"job {job['jobId']} {job['status']} ({accepted['outcome']}) "
                        f"agent {job['agentId']} kind {job['kind']} route {job['route']}"
                    )
                )
                click.echo(printable(f"events: {client.shown_url}{accepted['async']['eventsUrl']}"))
            return
        if not as_json:
            click.echo(printable(f"job {job['jobId']} {accepted['outcome']}; waiting"), err=True)
        sys.exit(_wait(client, job["jobId"], as_json))


@click.group("jobs")
def jobs_group() -> None:
    """List, inspect, follow and command jobs through the API (RECEIPT_API_URL).

    Exit status: 0 done; 2 usage error; 3 the API refused the request (the message says why);
    4 it could not be reached, did not answer, was unavailable or at a limit (try again later).
    """


@jobs_group.command("ls")
@click.option("--status", type=click.Choice(STATUSES), help="Only jobs in this status.")
@click.option("--agent-id", help="Only jobs of this agent.")
@click.option("--lane", type=click.Choice(LANES), help="Only jobs in this lane.")
@click.option("--session-key", help="Only jobs on this session key.")
@click.option("--kind", type=click.Choice(KINDS), help="Only jobs of this payload kind.")
@click.option("--organization-id", help="Only this organization's jobs (admin tokens).")
@click.option("--limit", type=click.IntRange(1, 500), default=50, show_default=True)
@click.option("--cursor", help="Continue from a previous page's next cursor.")
@click.option("--all", "every_page", is_flag=True, help="Follow the cursor through every page.")
@_api_options
def jobs_ls(
    status: str | None,
    agent_id: str | None,
    lane: str | None,
    session_key: str | None,
    kind: str | None,
    organization_id: str | None,
    limit: int,
    cursor: str | None,
    every_page: bool,
    api_url: str,
    token: str | None,
    as_json: bool,
) -> None:
    """List jobs, newest first (GET /jobs). Prints the next page's cursor on stderr."""
    query = _given(
        {
            "status": status,
            "agentId": agent_id,
            "lane": lane,
            "sessionKey": session_key,
            "kind": kind,
            "organizationId": organization_id,
            "limit": limit,
        }
    )
    header = not as_json  # once the API answered: a refusal prints nothing on stdout
    with ApiClient(api_url, token) as client:
        while True:
            page = client.request(
                "GET", "/jobs", params={**query, "cursor": cursor} if cursor else query
            )
            if header:
                click.echo(
                    f"{'JOB ID':<38} {'AGENT':<16} {'KIND':<30} {'STATUS':<9} ATTEMPT  CREATED"
                )
                header = False
            for job in page["jobs"]:
                if as_json:
                    click.echo(_compact(job))
                else:
                    click.echo(
                        printable(
                            f"{job['jobId']:<38} {job['agentId']:<16} {job['kind']:<30} "
                            f"{job['status']:<9} {job['attempt']}/{job['maxAttempts']:<6} "
                            f"{job['createdAt']}"
                        )
                    )
            cursor = page["nextCursor"]
            if not cursor or not every_page:
                break
        if cursor and not as_json:
            click.echo(printable(f"more: --cursor {cursor}"), err=True)


@jobs_group.command("get")
@click.argument("job_id", metavar="ID")
@_api_options
def jobs_get(job_id: str, api_url: str, token: str | None, as_json: bool) -> None:
    """Show a job: status, attempt, lease, route, pending commands, result (GET /jobs/ID)."""
    with ApiClient(api_url, token) as client:
        job = client.request("GET", _job_path(job_id))
    _echo_view(job, _summary, as_json)


@jobs_group.command("events")
@click.argument("job_id", metavar="ID")
@click.option("--after", type=click.IntRange(min=0), default=0, help="Only receipts past this seq.")
@click.option(
    "--follow", is_flag=True, help="Stay connected and print receipts live until the job ends."
)
@_api_options
def jobs_events(
    job_id: str, after: int, follow: bool, api_url: str, token: str | None, as_json: bool
) -> None:
    """Print a job's receipts in order (GET /jobs/ID/events); --json prints one per line."""
    with ApiClient(api_url, token) as client:
        receipts = (
            client.follow_raw(_job_path(job_id, "/events"), after, job_id)
            if follow
            else client.pages(_job_path(job_id, "/events"), after)
        )
        for receipt in receipts:
            _echo_receipt(receipt, as_json)


def _command(
    client: ApiClient,
    job_id: str,
    type_: str,
    payload: Any,
    reason: str | None,
    as_json: bool,
    idempotency_key: str | None,
) -> None:
    body = {"type": type_, **_given({"payload": payload, "reason": reason})}
    # Named by a key of its own, as an id-less enqueue: sent again after no answer, the same
    # command (not a second steer, nor a 409 from the cancel the first abort made).
    key = idempotency_key or str(uuid.uuid4())
    accepted = client.post_once(_job_path(job_id, "/commands"), body, key)
    if as_json:
        click.echo(_dump(accepted))
    else:
        click.echo(
            printable(
                f"{type_} {accepted['commandId']} appended to job {job_id} "
                f"(status {accepted['job']['status']})"
            )
        )


def _message_command(type_: str, summary: str) -> click.Command:
    @click.command(type_.replace("_", "-"), help=summary)
    @click.argument("job_id", metavar="ID")
    @click.option(
        "--payload",
        "payload_source",
        metavar="JSON|@FILE|@-",
        help="The message: inline JSON, @file.json, or @- for stdin.",
    )
    @click.option("--reason", help="Why (recorded on the receipt).")
    @idempotency_key_option
    @_api_options
    def command(
        job_id: str,
        payload_source: str | None,
        reason: str | None,
        idempotency_key: str | None,
        api_url: str,
        token: str | None,
        as_json: bool,
    ) -> None:
        payload = _load_json(payload_source, "--payload") if payload_source else None
        with ApiClient(api_url, token) as client:
            _command(client, job_id, type_, payload, reason, as_json, idempotency_key)

    return command


jobs_group.add_command(
    _message_command(
        "steer",
        "Steer a job that is not terminal: the handler reads the message while it runs "
        "(POST /jobs/ID/commands). Exit 3 if the job is terminal.",
    )
)
jobs_group.add_command(
    _message_command(
        "follow_up",
        "Queue a follow-up message for a job that is not terminal (POST /jobs/ID/commands). "
        "Exit 3 if the job is terminal.",
    )
)


@jobs_group.command("abort")
@click.argument("job_id", metavar="ID")
@click.option("--reason", help="Why (recorded on the receipt).")
@idempotency_key_option
@_api_options
def jobs_abort(
    job_id: str,
    reason: str | None,
    idempotency_key: str | None,
    api_url: str,
    token: str | None,
    as_json: bool,
) -> None:
    """Abort a job (POST /jobs/ID/commands): a queued job is canceled at once; a leased or
    running one gets abortRequested and its worker cancels it. Exit 3 if it is already terminal."""
    with ApiClient(api_url, token) as client:
        _command(client, job_id, "abort", None, reason, as_json, idempotency_key)


@jobs_group.command("retry")
@click.argument("job_id", metavar="[ID]", required=False)
@click.option(
    "--status",
    type=click.Choice(("failed", "canceled")),
    help="Bulk: retry settled jobs in this status (default failed).",
)
@click.option("--agent-id", "--agent", "agent_id", help="Bulk: only jobs of this agent.")
@click.option("--kind", type=click.Choice(KINDS), help="Bulk: only jobs of this payload kind.")
@click.option("--lane", type=click.Choice(LANES), help="Bulk: only jobs in this lane.")
@click.option("--error", help="Bulk: only jobs that failed with exactly this error.")
@click.option("--organization-id", help="Bulk: only this organization's jobs (admin tokens).")
@click.option("--limit", type=click.IntRange(1, 500), default=100, show_default=True)
@_api_options
def jobs_retry(
    job_id: str | None,
    status: str | None,
    agent_id: str | None,
    kind: str | None,
    lane: str | None,
    error: str | None,
    organization_id: str | None,
    limit: int,
    api_url: str,
    token: str | None,
    as_json: bool,
) -> None:
    """Retry a failed or canceled job (POST /jobs/ID/retry), or with no ID every one matching
    the filters that was never retried, at most --limit (POST /jobs/retry). A retry is a new job
    with the old one's payload and route; retrying again creates nothing new."""
    bulk = _given(
        {
            "status": status,
            "agentId": agent_id,
            "kind": kind,
            "lane": lane,
            "error": error,
            "organizationId": organization_id,
        }
    )
    with ApiClient(api_url, token) as client:
        if job_id is not None:
            if bulk:
                raise click.UsageError("give a job ID or filters, not both")
            answer = client.request("POST", _job_path(job_id, "/retry"))
            if as_json:
                click.echo(_dump(answer))
            else:
                verb = "retried as" if answer["outcome"] == "retried" else "was already retried as"
                click.echo(printable(f"{job_id} {verb} {answer['retry']['jobId']}"))
            return
        answer = client.request("POST", "/jobs/retry", json={**bulk, "limit": limit})
    if as_json:
        click.echo(_dump(answer))
        return
    for pair in answer["retried"]:
        click.echo(printable(f"{pair['jobId']} retried as {pair['retryJobId']}"))
    click.echo(f"{answer['count']} job(s) retried")


@click.command("api")
@click.option(
    "--host",
    help="Bind address (default: RECEIPT_API_HOST, else 127.0.0.1). Without tokens only a "
    "loopback address is allowed.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    help="Port (default: RECEIPT_API_PORT, else 8000).",
)
def api_command(host: str | None, port: int | None) -> None:
    """Run the api role (`receipt role api`) on HOST:PORT until Ctrl-C or SIGTERM.

    The same process as the api role: it migrates the database first, then serves the HTTP API
    with the role's tracing, metrics, queued-job redrive and event loop. Database:
    RECEIPT_DATABASE_URL (else the embedded server); its migration and its LISTEN connection
    RECEIPT_DATABASE_DIRECT_URL when set (beside a transaction pooler). Tokens:
    RECEIPT_API_TOKENS_FILE and/or RECEIPT_API_TOKENS; without any, only a loopback bind is
    allowed. Body limit: RECEIPT_MAX_BODY_BYTES; RECEIPT_STRICT_AGENT_IDS=1 refuses unknown
    agent ids. Console sessions (/console): RECEIPT_CONSOLE_SESSION_TTL_S (12 h) and
    RECEIPT_CONSOLE_SESSION_IDLE_S (30 min). OpenAPI at /openapi.json, docs at /docs.
    """
    import dataclasses

    from roles.infra.settings import load_or_exit
    from roles.role import main as role_main

    settings = load_or_exit()
    # The options win over RECEIPT_API_HOST and RECEIPT_API_PORT.
    given = {"host": host, "port": port}
    api = settings.api.model_copy(update={k: v for k, v in given.items() if v is not None})
    settings = dataclasses.replace(settings, api=api)
    try:
        role_main("api", settings)  # a bad token setting: one line, exit 2, before the database
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from exc


def register(group: click.Group) -> None:
    """Add `enqueue`, `jobs` and `api` to the `receipt` command group."""
    group.add_command(enqueue_command)
    group.add_command(jobs_group)
    group.add_command(api_command)
