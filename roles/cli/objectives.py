"""`receipt objectives`: run an objective from a YAML or JSON file, list, show, follow, cancel."""

from __future__ import annotations

import json
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import httpx
import yaml

from receipt_client import segment
from roles.cli.client import (
    ApiClient,
    ApiFailure,
    TryAgain,
    _api_options,
    _compact,
    _dump,
    _echo_page,
    _echo_view,
    _finite,
    _json_text,
    idempotency_key_option,
    printable,
)

POLL_S = 0.5
# How long `--wait` follows an objective through an API it cannot reach (a restart), before it
# exits 4 (the API away: try again), never 1 (which says the objective failed).
UNREACHABLE_S = 60.0


class _Loader(yaml.SafeLoader):
    """YAML as JSON holds it: a date or a time is the string written (`due: 2026-01-02`), not
    a `date` the request could not carry."""


_Loader.add_constructor("tag:yaml.org,2002:timestamp", yaml.SafeLoader.construct_yaml_str)


class _Unreachable(Exception):
    """The API did not answer (a connection refused or dropped, a timeout)."""


WAIT_EXIT = {"completed": 0, "failed": 1, "canceled": 1}


def _path(objective_id: str, suffix: str = "") -> str:
    return f"/objectives/{segment(objective_id)}{suffix}"


def load_objective(path: Path) -> dict[str, Any]:
    """Read an objective file: YAML (`.yaml`/`.yml`) or JSON; it must hold one object."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror}", param_hint="FILE") from exc
    except UnicodeDecodeError as exc:
        raise click.BadParameter(f"{path} is not UTF-8: {exc}", param_hint="FILE") from exc
    try:
        if path.suffix in (".yaml", ".yml"):
            loaded = yaml.load(text, Loader=_Loader)  # a SafeLoader
        else:
            loaded = json.loads(text, parse_constant=_finite)
    except (yaml.YAMLError, ValueError) as exc:
        reason = " ".join(str(exc).split())  # one line, not the parser's drawing
        raise click.BadParameter(
            f"{path} is not valid YAML/JSON: {reason}", param_hint="FILE"
        ) from exc
    if not isinstance(loaded, dict):
        raise click.BadParameter(f"{path} must hold one objective object", param_hint="FILE")
    try:
        json.dumps(loaded, allow_nan=False)  # YAML's .nan, !!binary, !!set: not JSON
    except (TypeError, ValueError) as exc:
        raise click.BadParameter(
            f"{path} holds what is not valid JSON: {exc}", param_hint="FILE"
        ) from exc
    return loaded


def _elapsed(task: dict[str, Any], now: datetime) -> str:
    tries = task.get("tries") or []
    if not tries:
        return "-"
    current = tries[-1]
    start = current.get("startedAt") or current.get("dispatchedAt")
    if not start:
        return "-"
    end = current.get("settledAt")
    began = datetime.fromisoformat(start)
    finished = datetime.fromisoformat(end) if end else now
    return f"{max(0.0, (finished - began).total_seconds()):.1f}s"


def task_lines(view: dict[str, Any], now: datetime | None = None) -> list[str]:
    """One line per task: id, status, try, elapsed, last output line; then the steps."""
    now = now or datetime.now(UTC)
    tasks = view.get("tasks") or []
    width = max([len(t["taskId"]) for t in tasks] + [8])
    lines = [
        f"objective {view['objectiveId']} {view['status']} phase {view['phase']}"
        + (f": {view['error']}" if view.get("error") else "")
    ]
    for task in tasks:
        last = (task.get("lastOutput") or "").strip()
        tries = len(task.get("tries") or [])
        lines.append(
            f"  {task['taskId']:<{width}}  {task['status']:<10} try {tries}/{task['maxAttempts']}"
            f"  {_elapsed(task, now):>7}  {last[:80]}"
        )
    for name in ("validateStep", "publishStep"):
        step = view.get(name)
        if step:
            lines.append(f"  {step['name']:<{width}}  {step['status']:<10}")
    return [printable(line) for line in lines]


def _settled(view: dict[str, Any]) -> bool:
    return view["status"] in WAIT_EXIT and (
        view.get("audit") is not None or view.get("auditJobId") is None
    )


def _created(client: ApiClient, objective_id: str, run_job_id: str) -> dict[str, Any] | None:
    """The objective's view once its `factory.run` job created it; None while it has not.

    Raises `ApiFailure` naming the run job's error when that job failed (an invalid planned
    graph, an id taken by another organization): no objective will ever exist.
    """
    try:
        response = client.http.get(_path(objective_id))
    except httpx.TransportError as exc:  # the API restarting: followed through, for a while
        raise _Unreachable(str(exc)) from exc
    if response.status_code in (502, 503, 504):  # its database or a proxy in front: the same
        raise _Unreachable(f"the API answered {response.status_code}")
    if response.status_code == 200:
        view: dict[str, Any] = response.json()
        return view
    if response.status_code != 404:
        return client.request("GET", _path(objective_id))  # raises the API's error
    job = client.request("GET", f"/jobs/{segment(run_job_id)}")
    if job["status"] in ("failed", "canceled"):
        raise ApiFailure(f"objective {objective_id} was not created: {job.get('error')}")
    return None


def follow(client: ApiClient, objective_id: str, as_json: bool, run_job_id: str) -> int:
    """Show per-task progress until the objective is settled (and audited); return the exit code.

    On a terminal the lines are redrawn in place; otherwise a line is printed when it changes.
    """
    live = sys.stdout.isatty() and not as_json
    shown: list[str] = []
    unreachable_since: float | None = None
    while True:
        try:
            view = _created(client, objective_id, run_job_id)
        except _Unreachable as exc:
            unreachable_since = unreachable_since or time.monotonic()
            if time.monotonic() - unreachable_since > UNREACHABLE_S:
                raise TryAgain(
                    f"the API could not be reached for {UNREACHABLE_S:g} s: {exc}"
                ) from exc
            time.sleep(POLL_S)
            continue
        unreachable_since = None
        if view is None:
            time.sleep(POLL_S)
            continue
        lines = task_lines(view)
        if live:
            if shown:
                click.echo(f"\x1b[{len(shown)}F\x1b[J", nl=False)
            click.echo("\n".join(lines))
            shown = lines
        elif not as_json:
            for line in lines:
                if line not in shown:
                    click.echo(line)
            shown = lines
        if _settled(view):
            if as_json:
                click.echo(_dump(view))
            elif view.get("audit"):
                totals = view["audit"]["totals"]
                click.echo(
                    f"audited: {totals['completed']}/{totals['tasks']} tasks completed, "
                    f"{totals['tries']} tries, {totals['durationMs']} ms"
                )
            return WAIT_EXIT[view["status"]]
        time.sleep(POLL_S)


@click.group("objectives")
def objectives_group() -> None:
    """Run and inspect objectives: a goal planned into a task graph (RECEIPT_API_URL)."""


@objectives_group.command("run")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--wait", is_flag=True, help="Follow each task live until the objective settles.")
@click.option(
    "--organization",
    envvar="RECEIPT_ORGANIZATION_ID",
    help="authContext.organizationId when FILE has no authContext (needed with an admin token "
    "or an open API; an organization's token implies its own; env RECEIPT_ORGANIZATION_ID).",
)
@click.option(
    "--user",
    envvar="USER",
    default="cli",
    help="authContext.userId with --organization (default: env USER, else cli).",
)
@idempotency_key_option
@_api_options
def objectives_run(
    file: Path,
    wait: bool,
    organization: str | None,
    user: str,
    idempotency_key: str | None,
    api_url: str,
    token: str | None,
    as_json: bool,
) -> None:
    """Create the objective in FILE (YAML or JSON) through POST /objectives.

    Exit status: 0 accepted (with --wait: completed); 1 with --wait, failed or canceled; 2 usage
    error; 3 the API refused the objective (an invalid graph names its problem); 4 it could not
    be reached, did not answer, was unavailable or at a limit (try again later).
    """
    objective = load_objective(file)
    if organization and "authContext" not in objective:
        objective["authContext"] = {"userId": user, "organizationId": organization}
    # A FILE naming no objectiveId: the key names the objective, so a post the API may have
    # applied unheard is sent again safely.
    key = None if "objectiveId" in objective else (idempotency_key or str(uuid.uuid4()))
    with ApiClient(api_url, token) as client:
        accepted = client.post_once("/objectives", objective, key)
        if as_json and not wait:
            click.echo(_dump(accepted))
            return
        click.echo(
            printable(f"objective {accepted['objectiveId']} accepted ({accepted['outcome']})"),
            err=wait,
        )
        if not wait:
            click.echo(printable(f"events: {client.shown_url}{accepted['eventsUrl']}"))
            return
        sys.exit(follow(client, accepted["objectiveId"], as_json, accepted["job"]["jobId"]))


@objectives_group.command("ls")
@click.option(
    "--status",
    type=click.Choice(["active", "completed", "failed", "canceled"]),
    help="Only objectives in this status.",
)
@click.option("--limit", type=click.IntRange(1, 500), default=50, show_default=True)
@click.option("--cursor", help="Continue from a previous page's next cursor.")
@_api_options
def objectives_ls(
    status: str | None,
    limit: int,
    cursor: str | None,
    api_url: str,
    token: str | None,
    as_json: bool,
) -> None:
    """List objectives, newest first. Prints the next page's cursor on stderr."""
    params: dict[str, Any] = {"limit": limit}
    if status:
        params["status"] = status
    if cursor:
        params["cursor"] = cursor
    with ApiClient(api_url, token) as client:
        page = client.request("GET", "/objectives", params=params)
    _echo_page(
        page,
        "objectives",
        lambda o: (
            f"{o['objectiveId']}  {o['status']:<9} phase {o['phase']}  "
            f"{o['completedTasks']}/{o['tasks']} tasks  {o['title']}"
        ),
        as_json,
    )


@objectives_group.command("get")
@click.argument("objective_id")
@_api_options
def objectives_get(objective_id: str, api_url: str, token: str | None, as_json: bool) -> None:
    """Show an objective: phase, and each task's status, try, elapsed time and last output."""
    with ApiClient(api_url, token) as client:
        view = client.request("GET", _path(objective_id))
    _echo_view(view, task_lines, as_json)


@objectives_group.command("events")
@click.argument("objective_id")
@_api_options
def objectives_events(objective_id: str, api_url: str, token: str | None, as_json: bool) -> None:
    """Print the objective's receipts."""
    with ApiClient(api_url, token) as client:
        for receipt in client.pages(_path(objective_id, "/events")):
            if as_json:
                click.echo(_json_text(json.dumps(receipt, ensure_ascii=False)))
            else:
                data = _compact(receipt["data"])
                click.echo(printable(f"{receipt['seq']:>4} {receipt['type']:<30} {data[:160]}"))


@objectives_group.command("cancel")
@click.argument("objective_id")
@click.option("--reason", default=None, help="Recorded on the objective.")
@_api_options
def objectives_cancel(
    objective_id: str, reason: str | None, api_url: str, token: str | None, as_json: bool
) -> None:
    """Cancel an objective: its running jobs are aborted and it settles `canceled`."""
    with ApiClient(api_url, token) as client:
        answer = client.request(
            "POST", _path(objective_id, "/cancel"), json={"reason": reason} if reason else {}
        )
    click.echo(
        _dump(answer) if as_json else printable(f"objective {objective_id}: cancel requested")
    )
