"""`receipt agent-jobs`: create, list, show, answer, cancel background agent jobs and read the
owner session's events, over the HTTP API."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from receipt_client import segment
from receipts.agent_jobs.model import STATUSES
from roles.cli.client import (
    ApiClient,
    _api_options,
    _dump,
    _echo_page,
    _echo_receipt,
    _echo_view,
    _given,
    _load_json,
    _outcome_lines,
    printable,
)

TYPE_WIDTH = 26  # the longest agent-job receipt type


def _path(agent_job_id: str, suffix: str = "") -> str:
    return f"/agent-jobs/{segment(agent_job_id)}{suffix}"


def _summary(job: dict[str, Any]) -> list[str]:
    latest = job.get("latestStatus") or {}
    lines = [
        f"agent job {job['agentJobId']}",
        f"status    {job['status']} (attempt {job['attempt']}/5, turn {job['turn']}, "
        f"consecutive failures {job['consecutiveFailures']})",
        f"agent     {job['agentId']}   organization {job['organizationId']}",
        f"session   {job['ownerSessionId']} (tool call {job['sourceToolCallId']})",
        f"workspace {job['workspaceOwnerJobId']}",
    ]
    if job.get("queueJobId"):
        lines.append(f"turn job  {job['queueJobId']}")
    if job.get("availableAt") and job["status"] == "queued":
        lines.append(f"not before {job['availableAt']}")
    if latest.get("pendingToolCall"):
        call = latest["pendingToolCall"]
        lines.append(f"waiting   {call['question']!r} (tool call {call['toolCallId']})")
    if job.get("cancelRequested"):
        lines.append(f"cancel    requested ({job.get('cancelReason')})")
    return lines + _outcome_lines(job)


@click.group("agent-jobs")
def agent_jobs_group() -> None:
    """Background agent jobs: durable work an agent delegates from a session."""


@agent_jobs_group.command("create")
@click.argument("agent_id")
@click.option("--session", "owner_session_id", required=True, help="The owner session id.")
@click.option("--prompt", help="The job's prompt.")
@click.option("--command", "command_json", metavar="JSON", help="The job's command (a JSON argv).")
@click.option("--source-event", default="cli", show_default=True, help="sourceActorEventId.")
@click.option(
    "--tool-call", required=True, help="sourceToolCallId (a retry with it is idempotent)."
)
@click.option("--route", required=True, metavar="BINDING/CHANNEL[/THREAD]", help="Reply route.")
@click.option("--workspace-template", metavar="TEXT|@FILE", help="The top of AGENTS.md.")
@click.option("--continued-from", help="Continue this agent job (and reuse its workspace).")
@click.option("--provider-binding", help="The provider binding of the job's model turns.")
@click.option("--organization-id", help="Organization (admin tokens only).")
@click.option("--wait", is_flag=True, help="Wait until it asks for input or ends; print it then.")
@click.option("--id-only", is_flag=True, help="Print only the job's id (for scripts).")
@_api_options
def create_command(
    agent_id: str,
    owner_session_id: str,
    prompt: str | None,
    command_json: str | None,
    source_event: str,
    tool_call: str,
    route: str,
    workspace_template: str | None,
    continued_from: str | None,
    provider_binding: str | None,
    organization_id: str | None,
    wait: bool,
    id_only: bool,
    api_url: str,
    token: str | None,
    as_json: bool,
) -> None:
    """Create an agent job for AGENT_ID (POST /agent-jobs).

    With --wait, follow it until it waits for input or ends, then print it: exit status 0 when
    it waits or succeeded, 1 when it failed or was stopped."""
    if (prompt is None) == (command_json is None):
        raise click.UsageError("give exactly one of --prompt and --command")
    parts = route.split("/", 2)
    if len(parts) < 2:
        raise click.BadParameter("expected BINDING/CHANNEL[/THREAD]", param_hint="--route")
    body: dict[str, Any] = {
        "agentId": agent_id,
        "ownerSessionId": owner_session_id,
        "sourceActorEventId": source_event,
        "sourceToolCallId": tool_call,
        "replyRoute": {
            "binding": parts[0],
            "channel": parts[1],
            "thread": parts[2] if len(parts) > 2 else None,
        },
        "input": {"prompt": prompt}
        if prompt is not None
        else {"command": _load_json(str(command_json), "--command")},
    }
    if workspace_template is not None:
        if workspace_template.startswith("@"):
            try:
                workspace_template = Path(workspace_template[1:]).read_text(encoding="utf-8")
            except OSError as exc:
                raise click.BadParameter(
                    f"cannot read {workspace_template[1:]}: {exc.strerror}",
                    param_hint="--workspace-template",
                ) from exc
        body["workspaceTemplate"] = workspace_template
    options = {
        "continuedFromJobId": continued_from,
        "providerBinding": provider_binding,
        "organizationId": organization_id,
    }
    body.update(_given(options))
    with ApiClient(api_url, token) as client:
        created = client.request("POST", "/agent-jobs", json=body)
        job = created["agentJob"]
        if id_only:
            click.echo(printable(job["agentJobId"]))
        elif as_json and not wait:
            click.echo(_dump(created))
        elif not as_json:
            verb = "created" if created["created"] else "exists"
            click.echo(printable(f"{verb} {job['agentJobId']} ({job['status']})"))
        if wait:
            sys.exit(_wait(client, job["agentJobId"], job["seq"], as_json, quiet=id_only))


# An agent job stops to be looked at when it waits for its owner, or when it ends.
RESTING = ("waiting_on_user", "succeeded", "failed", "stopped")


def _wait(client: ApiClient, agent_job_id: str, after: int, as_json: bool, quiet: bool) -> int:
    """Follow the job's receipts past `after` until it asks for input (unanswered) or ends;
    print it (unless `quiet`) and return the exit status: 0 waiting or succeeded, 1 otherwise."""
    job = client.request("GET", _path(agent_job_id))
    resting = job["status"] in RESTING and not job.get("latestStatus", {}).get("answered")
    if not resting:
        for receipt in client.follow_raw(_path(agent_job_id, "/events"), after, agent_job_id):
            if receipt["type"] == "agent_job.transitioned" and receipt["data"]["to"] in RESTING:
                break
        job = client.request("GET", _path(agent_job_id))
    if not quiet:
        _echo_view(job, _summary, as_json)
    return 0 if job["status"] in ("waiting_on_user", "succeeded") else 1


@agent_jobs_group.command("ls")
@click.option("--status", type=click.Choice(STATUSES), help="Only jobs in this status.")
@click.option("--agent-id", help="Only jobs of this agent.")
@click.option("--session", "owner_session_id", help="Only jobs of this owner session.")
@click.option("--organization-id", help="Only this organization (with --console).")
@click.option("--console", is_flag=True, help="Every organization's jobs (admin tokens).")
@click.option("--limit", type=click.IntRange(1, 500), default=50, show_default=True)
@click.option("--cursor", help="Continue from a previous page's next cursor.")
@_api_options
def ls_command(
    status: str | None,
    agent_id: str | None,
    owner_session_id: str | None,
    organization_id: str | None,
    console: bool,
    limit: int,
    cursor: str | None,
    api_url: str,
    token: str | None,
    as_json: bool,
) -> None:
    """List an owner session's agent jobs (GET /sessions/ID/agent-jobs), or with --console
    every organization's (GET /console/agent-jobs), newest first."""
    if organization_id is not None and not console:
        raise click.UsageError("--organization-id goes with --console (an admin's listing)")
    params = _given(
        {
            "status": status,
            "agentId": agent_id,
            "ownerSessionId": owner_session_id,
            "organizationId": organization_id,
            "cursor": cursor,
        }
    )
    params["limit"] = str(limit)
    if console:
        path = "/console/agent-jobs"
    elif owner_session_id is not None:
        path = f"/sessions/{segment(owner_session_id)}/agent-jobs"
        del params["ownerSessionId"]
    else:
        raise click.UsageError("give --session (an owner session's jobs) or --console (admin)")
    with ApiClient(api_url, token) as client:
        page = client.request("GET", path, params=params)
    _echo_page(
        page,
        "agentJobs",
        lambda job: (
            f"{job['agentJobId']}  {job['status']:<15} {job['agentId']:<16} "
            f"attempt {job['attempt']} turn {job['turn']}  {job['createdAt']}"
        ),
        as_json,
    )


@agent_jobs_group.command("get")
@click.argument("agent_job_id", metavar="ID")
@click.option("--console", is_flag=True, help="The console view: turns, wakeups (admin tokens).")
@_api_options
def get_command(
    agent_job_id: str, console: bool, api_url: str, token: str | None, as_json: bool
) -> None:
    """Show an agent job: status, attempt, turn, pending question, result."""
    with ApiClient(api_url, token) as client:
        if console:
            shown = client.request("GET", f"/console{_path(agent_job_id)}")
            if as_json:
                click.echo(_dump(shown))
                return
            _echo_view(shown["agentJob"], _summary, False)
            for turn in shown["turns"]:
                click.echo(printable(f"turn job  {turn['jobId']}  {turn['status']}"))
            for wakeup in shown["wakeups"]:
                click.echo(printable(f"wakeup    {wakeup['data']['sourceId']}"))
            return
        _echo_view(client.request("GET", _path(agent_job_id)), _summary, as_json)


@agent_jobs_group.command("answer")
@click.argument("agent_job_id", metavar="ID")
@click.argument("answer")
@click.option("--tool-call", help="The pending tool call id being answered.")
@click.option("--json-answer", is_flag=True, help="Parse ANSWER as JSON (default: a string).")
@click.option("--wait", is_flag=True, help="Wait until it asks again or ends; print it then.")
@_api_options
def answer_command(
    agent_job_id: str,
    answer: str,
    tool_call: str | None,
    json_answer: bool,
    wait: bool,
    api_url: str,
    token: str | None,
    as_json: bool,
) -> None:
    """Answer a job waiting for input (POST /agent-jobs/ID/input). With --wait, follow it until
    it asks again or ends (exit status as `create --wait`)."""
    parsed = _load_json(answer, "ANSWER") if json_answer else answer
    body = {"answer": parsed, **_given({"toolCallId": tool_call})}
    with ApiClient(api_url, token) as client:
        accepted = client.request("POST", _path(agent_job_id, "/input"), json=body)
        job = accepted["agentJob"]
        if as_json and not wait:
            click.echo(_dump(accepted))
        elif not as_json:
            click.echo(
                printable(
                    f"answered {job['agentJobId']} ({job['status']}; "
                    "it continues when a slot is free)"
                )
            )
        if wait:
            sys.exit(_wait(client, job["agentJobId"], job["seq"], as_json, quiet=False))


@agent_jobs_group.command("cancel")
@click.argument("agent_job_id", metavar="ID")
@click.option("--reason", help="Why (recorded on the job).")
@_api_options
def cancel_command(
    agent_job_id: str, reason: str | None, api_url: str, token: str | None, as_json: bool
) -> None:
    """Stop an agent job at once (a token of its organization, or an admin token; a live turn is
    left to finish on its own, and nothing it does afterwards reaches the job or its owner)."""
    body = _given({"reason": reason})
    with ApiClient(api_url, token) as client:
        accepted = client.request("POST", _path(agent_job_id, "/cancel"), json=body)
    job = accepted["agentJob"]
    if as_json:
        click.echo(_dump(accepted))
    else:
        click.echo(printable(f"{job['status']} {job['agentJobId']}"))


@agent_jobs_group.command("events")
@click.argument("agent_job_id", metavar="[ID]", required=False)
@click.option("--session", "session_id", help="The owner session's stream (wakeups) instead.")
@click.option("--after", type=click.IntRange(min=0), default=0, help="Only receipts past this seq.")
@click.option(
    "--follow",
    is_flag=True,
    help="Stay connected, print live: until the job is finished (a session's: until interrupted).",
)
@_api_options
def events_command(
    agent_job_id: str | None,
    session_id: str | None,
    after: int,
    follow: bool,
    api_url: str,
    token: str | None,
    as_json: bool,
) -> None:
    """Print an agent job's receipts, or (--session) its owner session's wakeups."""
    if agent_job_id is not None and session_id is not None:
        raise click.UsageError("give an agent job ID or --session, not both")
    if agent_job_id is None and session_id is None:
        raise click.UsageError("give an agent job ID, or --session with an owner session id")
    if session_id is not None:
        path, name = f"/sessions/{segment(session_id)}/events", f"session {session_id}"
    else:
        path, name = _path(str(agent_job_id), "/events"), f"agent job {agent_job_id}"
    with ApiClient(api_url, token) as client:
        live = client.follow_raw(path, after, name) if follow else client.pages(path, after)
        for receipt in live:
            _echo_receipt(receipt, as_json, TYPE_WIDTH)
