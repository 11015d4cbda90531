"""`receipt schedules`: create, list, show, pause, resume and delete the recurring jobs of an
organization (README, "Schedules")."""

from __future__ import annotations

import uuid
from typing import Any

import click

from receipt_client import segment
from roles.cli.client import (
    ApiClient,
    _api_options,
    _dump,
    _echo_page,
    _echo_view,
    _load_json,
    idempotency_key_option,
    printable,
)


def _path(schedule_id: str) -> str:
    return f"/schedules/{segment(schedule_id)}"


def _when(view: dict[str, Any]) -> str:
    if view.get("cron"):
        return f"cron {view['cron']} ({view.get('timezone') or 'UTC'})"
    return f"every {view.get('intervalS')} s"


def schedule_lines(view: dict[str, Any]) -> list[str]:
    """The schedule: what and when, its next fire times, its last runs with their jobs."""
    lines = [
        f"{view['scheduleId']}  {view['status']}  {_when(view)}  overlap {view['overlap']}  "
        f"agent {view['agentId']}",
        f"fired {view['fired']}, skipped {view['skipped']}",
    ]
    if view.get("note"):
        lines.append(f"note: {view['note']}")
    if view.get("nextFireTimes"):
        lines.append("next: " + ", ".join(view["nextFireTimes"][:3]))
    for run in view.get("lastRuns") or []:
        job = run.get("jobId") or (
            f"(skipped: {run['runningJobId']} still active)"
            if run.get("runningJobId")
            else f"(skipped: {run.get('reason')})"
        )
        status = f" {run['jobStatus']}" if run.get("jobStatus") else ""
        lines.append(f"  {run['fireTime']}  {run['outcome']:<8} {job}{status}")
    return lines


@click.group("schedules")
def schedules_group() -> None:
    """Recurring jobs: a cron expression or an interval, and the job each firing enqueues."""


@schedules_group.command("create")
@click.option("--id", "schedule_id", default=None, help="The schedule id (default: generated).")
@click.option("--cron", default=None, help="Five-field cron, e.g. '*/15 * * * *'.")
@click.option("--interval", default=None, help="An interval, e.g. 30s, 15m, 2h, 1d.")
@click.option("--timezone", default=None, help="IANA time zone of the cron (default UTC).")
@click.option("--agent", "agent_id", required=True, help="The agent each firing's job is for.")
@click.option(
    "--job",
    "job",
    required=True,
    metavar="JSON",
    help="The enqueue body each firing posts: inline JSON, @file.json or @- (stdin).",
)
@click.option(
    "--overlap",
    type=click.Choice(["skip", "allow", "cancel_previous"]),
    default="skip",
    show_default=True,
    help="A firing while the previous job is still active.",
)
@click.option("--paused", is_flag=True, help="Create it paused.")
@idempotency_key_option
@_api_options
def schedules_create(
    schedule_id: str | None,
    cron: str | None,
    interval: str | None,
    timezone: str | None,
    agent_id: str,
    job: str,
    overlap: str,
    paused: bool,
    idempotency_key: str | None,
    api_url: str,
    token: str | None,
    as_json: bool,
) -> None:
    """Create a schedule; each firing enqueues `<scheduleId>:<fire time>`."""
    body: dict[str, Any] = {
        "agentId": agent_id,
        "job": _load_json(job, "--job"),
        "overlap": overlap,
        "paused": paused,
    }
    for name, value in (
        ("scheduleId", schedule_id),
        ("cron", cron),
        ("interval", interval),
        ("timezone", timezone),
    ):
        if value is not None:
            body[name] = value
    key = None if schedule_id is not None else (idempotency_key or str(uuid.uuid4()))
    with ApiClient(api_url, token) as client:
        view = client.post_once("/schedules", body, key)
    _echo_view(view, schedule_lines, as_json)


@schedules_group.command("ls")
@click.option("--limit", type=click.IntRange(1, 200), default=50, show_default=True)
@click.option("--cursor", help="Continue from a previous page's next cursor.")
@_api_options
def schedules_ls(
    limit: int, cursor: str | None, api_url: str, token: str | None, as_json: bool
) -> None:
    """List schedules, newest first. Prints the next page's cursor on stderr."""
    params: dict[str, Any] = {"limit": limit}
    if cursor:
        params["cursor"] = cursor
    with ApiClient(api_url, token) as client:
        page = client.request("GET", "/schedules", params=params)
    _echo_page(
        page,
        "schedules",
        lambda s: (
            f"{s['scheduleId']}  {s['status']:<7} {_when(s)}  fired {s['fired']}  "
            f"next {(s.get('nextFireTimes') or ['-'])[0]}"
        ),
        as_json,
    )


@schedules_group.command("get")
@click.argument("schedule_id")
@_api_options
def schedules_get(schedule_id: str, api_url: str, token: str | None, as_json: bool) -> None:
    """Show a schedule: its next fire times and last runs with their jobs."""
    with ApiClient(api_url, token) as client:
        view = client.request("GET", _path(schedule_id))
    _echo_view(view, schedule_lines, as_json)


def _patch(schedule_id: str, body: dict[str, Any], api_url: str, token: str | None) -> Any:
    with ApiClient(api_url, token) as client:
        return client.request("PATCH", _path(schedule_id), json=body)


@schedules_group.command("pause")
@click.argument("schedule_id")
@click.option("--note", default=None, help="Why it is paused (shown with it).")
@_api_options
def schedules_pause(
    schedule_id: str, note: str | None, api_url: str, token: str | None, as_json: bool
) -> None:
    """Pause a schedule: it fires nothing until resumed."""
    body: dict[str, Any] = {"paused": True}
    if note is not None:
        body["note"] = note
    _echo_view(_patch(schedule_id, body, api_url, token), schedule_lines, as_json)


@schedules_group.command("resume")
@click.argument("schedule_id")
@_api_options
def schedules_resume(schedule_id: str, api_url: str, token: str | None, as_json: bool) -> None:
    """Resume a paused schedule."""
    _echo_view(_patch(schedule_id, {"paused": False}, api_url, token), schedule_lines, as_json)


@schedules_group.command("delete")
@click.argument("schedule_id")
@_api_options
def schedules_delete(schedule_id: str, api_url: str, token: str | None, as_json: bool) -> None:
    """Delete a schedule: it fires no more (its jobs are left as they are)."""
    with ApiClient(api_url, token) as client:
        client.request("DELETE", _path(schedule_id))
    click.echo(
        _dump({"scheduleId": schedule_id, "deleted": True})
        if as_json
        else printable(f"schedule {schedule_id} deleted")
    )
