"""The CLI's HTTP client: the API client (receipt-client's), its errors and exit statuses, and the
options and output helpers the `receipt` commands over the API share (`roles/cli/jobs.py`,
`objectives.py`, `agent_jobs.py`).

Exit status of every API command: 0 success; 1 the job ended failed or canceled (only
`enqueue --wait` waits for the end); 2 usage error; 3 the API refused the request (sent again
as it is, refused again); 4 it could not be reached, did not answer, was unavailable or at a
limit (the same command may succeed later); 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import click

from receipt_client import Client, ConnectionFailed, ReceiptError, segment
from receipt_client.deadline import NEVER, Deadline
from receipt_client.settings import DEFAULT_URL as DEFAULT_API_URL
from receipts import jobs as jobmodel
from receipts.jobs import Job, Receipt

EXIT_NOT_COMPLETED = 1
EXIT_API_ERROR = 3  # the API refused the request: sent again as it is, it is refused again
EXIT_TRY_AGAIN = 4  # no answer, the API away or at a limit: the same command may do later
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as a shell reports it

# A terminal acts on C0 and C1 control characters (ESC starts an escape sequence; 0x9b is CSI):
# a hostile tenant's id, error or output must not retitle, clear or rewrite a reader's terminal.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_JSON_CONTROL = re.compile("[\x7f-\x9f]")  # json.dumps escapes the C0 ones itself

F = TypeVar("F", bound=Callable[..., Any])


class ApiFailure(click.ClickException):
    """The API refused the request (exit status 3): sent again as it is, it is refused again."""

    exit_code = EXIT_API_ERROR

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {printable(self.message)}", err=True)


class TryAgain(ApiFailure):
    """The API could not be reached, did not answer, was unavailable or at a limit (exit status
    4): the same command, sent again later, may succeed (a post whose answer was lost with its
    Idempotency-Key)."""

    exit_code = EXIT_TRY_AGAIN


def failure_of(exc: ReceiptError) -> ApiFailure:
    """`exc` as the CLI reports it: `TryAgain` when nothing was refused for good — the API could
    not be reached or did not answer (`ConnectionFailed`), was away or without its database
    (502, 503, 504) or at a limit (429) —, else `ApiFailure`."""
    later = isinstance(exc, ConnectionFailed) or exc.status in (429, 502, 503, 504)
    return (TryAgain if later else ApiFailure)(str(exc))


def printable(text: str) -> str:
    """`text` for a terminal, on one line: each control character shown as `\\xNN`."""
    return _CONTROL.sub(lambda char: f"\\x{ord(char.group()):02x}", text)


def receipt_of(body: dict[str, Any]) -> Receipt:
    """Rebuild a `Receipt` from its JSON form (to fold a job's state on the client side)."""
    return Receipt(
        body["stream"],
        body["seq"],
        body["type"],
        body["data"],
        datetime.fromisoformat(body["recordedAt"]),
        body.get("position", 0),
    )


class ApiClient(Client):
    """The commands' client: receipt-client's (`clients/python`), each refusal raised as
    `ApiFailure` (exit status 3, or 4 to try again). The commands print the API's JSON as it
    came, so they use its raw requests (`request`, `pages`, `follow_raw`), which its typed
    methods are built on."""

    def __init__(self, url: str, token: str | None) -> None:
        # httpx logs every request at INFO; the commands print what matters themselves.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        super().__init__(url, token or "")

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            return super().request(method, path, **kwargs)
        except ReceiptError as exc:
            raise failure_of(exc) from exc

    def post_once(self, path: str, body: Any, key: str | None) -> Any:
        """POST `body` carrying `Idempotency-Key: key` (None: a post naming its own id): one
        the API may have applied without its answer reaching here says the key to send it
        again with (`--idempotency-key`), which finds what the first made."""
        headers = {"Idempotency-Key": key} if key else None
        try:
            return self.request("POST", path, json=body, headers=headers)
        except ApiFailure as exc:
            if key is not None and "may have been applied" in exc.message:
                raise TryAgain(f"{exc.message}; repeat it with --idempotency-key {key}") from exc
            raise

    def follow_raw(
        self, path: str, after: int = 0, name: str | None = None, deadline: Deadline = NEVER
    ) -> Iterator[dict[str, Any]]:
        try:
            yield from super().follow_raw(path, after, name, deadline)
        except ReceiptError as exc:
            raise failure_of(exc) from exc


def _api_options(command: F) -> F:
    command = click.option(
        "--json", "as_json", is_flag=True, help="Print JSON (one document, or one per line)."
    )(command)
    command = click.option(
        "--token",
        envvar="RECEIPT_API_TOKEN",
        default=None,
        metavar="TOKEN",
        help="Bearer token (env RECEIPT_API_TOKEN).",
    )(command)
    command = click.option(
        "--api-url",
        envvar="RECEIPT_API_URL",
        default=DEFAULT_API_URL,
        show_default=True,
        callback=_api_url,
        help="Base URL of the API (env RECEIPT_API_URL).",
    )(command)
    return command


def _api_url(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """An http(s) URL with a host: anything else was reported as 'no answer from the API'."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise click.BadParameter(
            f"{value!r} is not an http:// or https:// URL with a host (e.g. {DEFAULT_API_URL})"
        )
    return value


def _load_json(value: str, option: str) -> Any:
    """Read `@file.json`, `@-` (stdin) or inline JSON."""
    try:
        if value == "@-":
            text = sys.stdin.read()
        elif value.startswith("@"):
            text = Path(value[1:]).read_text(encoding="utf-8")
        else:
            text = value
        return json.loads(text, parse_constant=_finite)
    except OSError as exc:
        raise click.BadParameter(
            f"cannot read {value[1:]}: {exc.strerror}", param_hint=option
        ) from exc
    except ValueError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint=option) from exc


def _finite(constant: str) -> Any:
    """`json.loads`' `parse_constant`: NaN and ±Infinity are not JSON (the request cannot carry
    them)."""
    raise ValueError(f"{constant} is not valid JSON (a number must be finite)")


def _json_text(text: str) -> str:
    """JSON text with the C1 controls and DEL escaped too (`\\u009b`): the same JSON, safe on a
    terminal."""
    return _JSON_CONTROL.sub(lambda char: f"\\u{ord(char.group()):04x}", text)


def _dump(value: Any) -> str:
    return _json_text(json.dumps(value, indent=2, ensure_ascii=False))


def _compact(value: Any) -> str:
    return _json_text(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def _given(values: dict[str, Any]) -> dict[str, Any]:
    """The values options gave (not None), for a request's body or query."""
    return {name: value for name, value in values.items() if value is not None}


def _echo_view(
    view: dict[str, Any], lines: Callable[[dict[str, Any]], list[str]], as_json: bool
) -> None:
    """Print what the API answered: the document with --json, else its summary `lines`."""
    click.echo(_dump(view) if as_json else "\n".join(printable(line) for line in lines(view)))


def _echo_receipt(receipt: dict[str, Any], as_json: bool, type_width: int = 22) -> None:
    """Print a receipt: compact JSON with --json, else `seq  recordedAt  type  data`."""
    if as_json:
        click.echo(_compact(receipt))
    else:
        click.echo(
            printable(
                f"{receipt['seq']:>4}  {receipt['recordedAt']}  {receipt['type']:<{type_width}} "
                f"{_compact(receipt['data'])}"
            )
        )


def _echo_page(
    page: dict[str, Any], key: str, line: Callable[[dict[str, Any]], str], as_json: bool
) -> None:
    """Print a page of a list: the whole document with --json, else one `line` per item and,
    when there is a next page, how to ask for it (on stderr)."""
    if as_json:
        click.echo(_dump(page))
        return
    for item in page[key]:
        click.echo(printable(line(item)))
    if page.get("nextCursor"):
        click.echo(printable(f"more: --cursor {page['nextCursor']}"), err=True)


def _outcome_lines(view: dict[str, Any]) -> list[str]:
    """The `error` and `result` lines of a job's or an agent job's summary (when it has them)."""
    lines = []
    if view.get("error"):
        lines.append(f"error     {view['error']}")
    if view.get("result") is not None:
        lines.append(f"result    {_compact(view['result'])}")
    return lines


def _job_path(job_id: str, suffix: str = "") -> str:
    return f"/jobs/{segment(job_id)}{suffix}"


def _summary(job: dict[str, Any]) -> list[str]:
    lines = [
        f"job       {job['jobId']}",
        f"status    {job['status']} (attempt {job['attempt']}/{job['maxAttempts']})",
        f"agent     {job['agentId']}"
        + ("" if job.get("agentHasHandler", True) else " (no handler)"),
        f"kind      {job['kind']}",
        f"lane      {job['lane']}",
        f"route     {job.get('route')} (contract: {job.get('contractWorkerGroup')})",
        f"created   {job['createdAt']}",
    ]
    if job.get("sessionKey"):
        lines.append(f"session   {job['sessionKey']}")
    if job.get("lease"):
        lease = job["lease"]
        lines.append(f"lease     {lease['workerId']} until {lease['expiresAt']}")
    pending = job.get("pendingCommands") or []
    if pending:
        lines.append("pending   " + ", ".join(f"{c['type']} {c['commandId']}" for c in pending))
    if job.get("abortRequested"):
        lines.append(f"abort     requested ({job.get('abortReason') or 'no reason'})")
    if job.get("canceledReason"):
        lines.append(f"canceled  {job['canceledReason']}")
    lines += _outcome_lines(job)
    if job.get("settledAt"):
        lines.append(f"settled   {job['settledAt']}")
    return lines


def _status_line(job: Job, receipts: int, last_type: str) -> str:
    return (
        f"{job.job_id}  {job.status}  attempt {job.attempt}/{job.max_attempts}"
        f"  receipts {receipts}  last {last_type}"
    )


def _wait(client: ApiClient, job_id: str, as_json: bool) -> int:
    """Show a live status line until the job is terminal; print it; 0 only if it completed."""
    state: Job | None = None
    count = 0
    live = sys.stderr.isatty()
    shown = ""
    for body in client.follow_raw(_job_path(job_id, "/events"), 0, job_id):
        receipt = receipt_of(body)
        state = jobmodel.apply(state, receipt)
        count += 1
        if state is None:
            continue
        line = printable(_status_line(state, count, receipt.type))
        if live:
            click.echo("\r\033[K" + line, nl=False, err=True)
        elif state.status != shown:
            click.echo(line, err=True)
        shown = state.status
    if live:
        click.echo(err=True)
    job = client.request("GET", _job_path(job_id))
    _echo_view(job, _summary, as_json)
    return 0 if job["status"] == "completed" else EXIT_NOT_COMPLETED


def idempotency_key_option(command: F) -> F:
    """`--idempotency-key KEY`: the key a post naming no id of its own carries."""
    return click.option(
        "--idempotency-key",
        metavar="KEY",
        help="The Idempotency-Key the post carries when it names no id (default: a new one, "
        "printed if the API does not answer in time, so the same post can be sent again safely).",
    )(command)
