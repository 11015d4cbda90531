"""`receipt agent-jobs`: create, list, show, answer, cancel background agent jobs and read the
owner session's events, over the HTTP API."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import click

from receipts.agent_jobs.model import STATUSES
from roles.cli.client import ApiClient, _api_options, _compact, _dump, _load_json


def _path(agent_job_id: str, suffix: str = "") -> str:
    return f"/agent-jobs/{quote(agent_job_id, safe='')}{suffix}"


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
    if job.get("error"):
        lines.append(f"error     {job['error']}")
    if job.get("result") is not None:
        lines.append(f"result    {_compact(job['result'])}")
    return lines


def _show(job: dict[str, Any], as_json: bool) -> None:
    click.echo(_dump(job) if as_json else "\n".join(_summary(job)))


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
    api_url: str,
    token: str | None,
    as_json: bool,
) -> None:
    """Create an agent job for AGENT_ID (POST /agent-jobs)."""
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
            with open(workspace_template[1:], encoding="utf-8") as handle:
                workspace_template = handle.read()
        body["workspaceTemplate"] = workspace_template
    for key, value in (
        ("continuedFromJobId", continued_from),
        ("providerBinding", provider_binding),
        ("organizationId", organization_id),
    ):
        if value is not None:
            body[key] = value
    with ApiClient(api_url, token) as client:
        created = client.call("POST", "/agent-jobs", json=body)
    if as_json:
        click.echo(_dump(created))
    else:
        job = created["agentJob"]
        verb = "created" if created["created"] else "exists"
        click.echo(f"{verb} {job['agentJobId']} ({job['status']})")


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
    params = {
        key: value
        for key, value in (
            ("status", status),
            ("agentId", agent_id),
            ("ownerSessionId", owner_session_id),
            ("organizationId", organization_id),
            ("cursor", cursor),
        )
        if value is not None
    }
    params["limit"] = str(limit)
    if console:
        path = "/console/agent-jobs"
    elif owner_session_id is not None:
        path = f"/sessions/{quote(owner_session_id, safe='')}/agent-jobs"
        del params["ownerSessionId"]
    else:
        raise click.UsageError("give --session (an owner session's jobs) or --console (admin)")
    with ApiClient(api_url, token) as client:
        page = client.call("GET", path, params=params)
    if as_json:
        click.echo(_dump(page))
        return
    for job in page["agentJobs"]:
        click.echo(
            f"{job['agentJobId']}  {job['status']:<15} {job['agentId']:<16} "
            f"attempt {job['attempt']} turn {job['turn']}  {job['createdAt']}"
        )
    if page.get("nextCursor"):
        click.echo(f"more: --cursor {page['nextCursor']}", err=True)


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
            shown = client.call("GET", f"/console{_path(agent_job_id)}")
            if as_json:
                click.echo(_dump(shown))
                return
            _show(shown["agentJob"], False)
            for turn in shown["turns"]:
                click.echo(f"turn job  {turn['jobId']}  {turn['status']}")
            for wakeup in shown["wakeups"]:
                click.echo(f"wakeup    {wakeup['data']['sourceId']}")
            return
        _show(client.call("GET", _path(agent_job_id)), as_json)


@agent_jobs_group.command("answer")
@click.argument("agent_job_id", metavar="ID")
@click.argument("answer")
@click.option("--tool-call", help="The pending tool call id being answered.")
@click.option("--json-answer", is_flag=True, help="Parse ANSWER as JSON (default: a string).")
@_api_options
def answer_command(
    agent_job_id: str,
    answer: str,
    tool_call: str | None,
    json_answer: bool,
    api_url: str,
    token: str | None,
    as_json: bool,
) -> None:
    """Answer a job waiting for input (POST /agent-jobs/ID/input)."""
    body: dict[str, Any] = {"answer": _load_json(answer, "ANSWER") if json_answer else answer}
    if tool_call is not None:
        body["toolCallId"] = tool_call
    with ApiClient(api_url, token) as client:
        accepted = client.call("POST", _path(agent_job_id, "/input"), json=body)
    job = accepted["agentJob"]
    if as_json:
        click.echo(_dump(accepted))
    else:
        click.echo(f"answered {job['agentJobId']} ({job['status']})")


@agent_jobs_group.command("cancel")
@click.argument("agent_job_id", metavar="ID")
@click.option("--reason", help="Why (recorded on the job).")
@_api_options
def cancel_command(
    agent_job_id: str, reason: str | None, api_url: str, token: str | None, as_json: bool
) -> None:
    """Stop an agent job (admin tokens; a live turn finishes first)."""
    body = {"reason": reason} if reason is not None else {}
    with ApiClient(api_url, token) as client:
        accepted = client.call("POST", f"/console{_path(agent_job_id, '/cancel')}", json=body)
    job = accepted["agentJob"]
    if as_json:
        click.echo(_dump(accepted))
    elif job["status"] == "stopped":
        click.echo(f"stopped {job['agentJobId']}")
    else:
        click.echo(f"stop requested for {job['agentJobId']}: stopped when its live turn settles")


def _print(receipt: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(_compact(receipt))
    else:
        click.echo(
            f"{receipt['seq']:>4}  {receipt['recordedAt']}  {receipt['type']:<26} "
            f"{_compact(receipt['data'])}"
        )


@agent_jobs_group.command("events")
@click.argument("agent_job_id", metavar="ID", required=False)
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
    if (agent_job_id is None) == (session_id is None):
        raise click.UsageError("give an agent job ID or --session, not both")
    if session_id is not None:
        path, name = f"/sessions/{quote(session_id, safe='')}/events", f"session {session_id}"
    else:
        path, name = _path(str(agent_job_id), "/events"), f"agent job {agent_job_id}"
    with ApiClient(api_url, token) as client:
        live = client.follow_events(path, after, name) if follow else client.receipts(path, after)
        for receipt in live:
            _print(receipt, as_json)
