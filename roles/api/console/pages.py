"""Console pages: sign-in, jobs (list, one job with its live output and actions), failed work."""

from __future__ import annotations

import json
import logging
import re
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape

from receipts import jobs as jobmodel
from receipts import reads
from receipts import retry as retries
from receipts.agent_jobs import interventions
from receipts.enqueue import Admission
from receipts.errors import InvalidInput
from receipts.jobs import COMMAND_TYPES, LANES, STATUSES, Job
from receipts.kinds import KINDS, TURN_KIND, runs_commands
from receipts.settings import Settings
from receipts.store import Store
from receipts.tenancy import caller_id
from roles.api.admission import caller_caps, held_retry
from roles.api.auth import COMMANDS_RUN, JOBS_READ, JOBS_WRITE, Principal
from roles.api.body import check_shape, keyed_id, loads, path_segment
from roles.api.console.paging import older_query, page_start
from roles.api.console.receipt_rows import attempts, progress_lines, timeline
from roles.api.console.session import (
    COOKIE,
    COOKIE_PATH,
    FormError,
    Session,
    check_new_session,
    check_sign_in,
    end_session,
    need,
    notice_of,
    notice_query,
    read_form,
    session_alive,
    session_of,
    sign_in_refused,
    start_session,
)
from roles.api.deps import ApiError, shown_id
from roles.api.limits import refusals
from roles.api.routes.jobs import followed_job
from roles.api.schema import shown_job_id
from roles.api.sse import as_seen_by, parse_last_event_id, parse_seq, stream_response

log = logging.getLogger("roles.api.console")

router = APIRouter(prefix="/console", include_in_schema=False)
STATIC_DIR = Path(__file__).parent / "static"
PAGE_SIZE = 50
TIMELINE_LIMIT = 2_000
FAILED_GROUPS = 100
FORM_KEY = re.compile(r"[0-9a-f]{32}")
FILTERS = ("status", "agentId", "lane", "kind", "organizationId", "sessionKey")

_templates = Environment(
    loader=PackageLoader("roles.api.console", "templates"),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)
# Every page builds links with these.
_templates.globals.update(segment=path_segment, urlencode=urlencode)


def temporal_workflows_url(settings: Settings) -> str:
    """The Temporal Web UI's list of the drivers' workflows (`RECEIPT_TEMPORAL_UI_URL`, in
    `RECEIPT_TEMPORAL_NAMESPACE`), which the job page links to. Without the URL's user and
    password (a UI behind basic auth): every reader of a job page, an organization's too, sees
    the link."""
    ui = settings.temporal_ui_url
    try:
        parts = urlsplit(ui)
        ui = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
    except ValueError:  # no URL (an IPv6 typo's unclosed [): as written, none if it has an @
        ui = "" if "@" in ui else ui
    ui = ui.rstrip("/")
    return f"{ui}/namespaces/{quote(settings.temporal_namespace)}/workflows"


def render(name: str, status: int = 200, **context: Any) -> HTMLResponse:
    """Render a page. `shown(job_id)` in templates is the id the signed-in caller knows a job by:
    an organization its own id, an admin the runtime's organization-scoped id."""
    session = context.get("session")
    admin = session is None or session.principal.admin
    context.setdefault("shown", _runtime_id if admin else caller_id)
    html = _templates.get_template(name).render(**context)
    return HTMLResponse(
        html,
        status_code=status,
        headers={
            "Cache-Control": "no-store",
            # Only our own origin: no CDN, no inline script, no framing.
            "Content-Security-Policy": "default-src 'self'; style-src 'self'; script-src 'self'; "
            "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "same-origin",
        },
    )


def _runtime_id(job_id: str) -> str:
    return job_id


def store_of(request: Request) -> Any:
    return request.app.state.api.require_store()


async def _find_job(store: Store, principal: Principal, job_id: str) -> Job | None:
    """`find_job`, an admin's id that several organizations use answered as a page."""
    try:
        return await reads.visible_job(store, principal, job_id)
    except reads.AmbiguousJobId as exc:
        raise FormError(409, str(exc)) from None


def _filters(request: Request) -> dict[str, str]:
    return {name: request.query_params[name] for name in FILTERS if request.query_params.get(name)}


def _job_filters(session: Session, filters: dict[str, str]) -> reads.JobFilters:
    def choice(name: str, allowed: tuple[str, ...]) -> str | None:
        value = filters.get(name)
        return value if value in allowed else None

    return reads.JobFilters(
        organization_id=filters.get("organizationId") if session.principal.admin else None,
        status=choice("status", STATUSES),
        agent_id=filters.get("agentId"),
        lane=choice("lane", LANES),
        session_key=filters.get("sessionKey"),
        kind=choice("kind", KINDS),
    )


# --- sign-in ----------------------------------------------------------------------------------


@router.get("")
async def console_root() -> RedirectResponse:
    return RedirectResponse("/console/jobs", status_code=303)


@router.get("/login")
async def login_page(request: Request) -> HTMLResponse:
    return render("login.html", session=None, error=None)  # no text of a link is shown


@router.post("/login")
async def login(request: Request) -> Response:
    tokens = request.app.state.api.tokens
    fields = await read_form(request, None)
    if tokens.open:
        return RedirectResponse("/console/jobs", status_code=303)
    # After the body is read: from here to the refusal's count nothing awaits, so concurrent
    # tries cannot all pass the budget's check before any is counted.
    check_sign_in(request)
    token = fields.get("token", "").strip()
    principal = tokens.authenticate(token) if token else None
    if principal is None or not principal.can(JOBS_READ):
        reason = "unknown token" if principal is None else f"the token lacks {JOBS_READ!r}"
        sign_in_refused(request)
        if refusals.due("console_sign_in_refused", "all") is not None:
            log.info("console sign-in refused", extra={"event": "console.sign_in_refused"})
        return render("login.html", status=401, session=None, error=reason)
    check_new_session(request, principal)
    # The browser gets a session's random id, never the token (README, "Operator console").
    session_id = await start_session(request, token)
    log.info("console sign-in", extra={"event": "console.sign_in"})
    response = RedirectResponse("/console/jobs", status_code=303)
    response.set_cookie(
        COOKIE,
        session_id,
        max_age=int(request.app.state.api.settings.console_session_ttl_s),
        httponly=True,
        samesite="strict",
        # https as uvicorn sees it: TLS to the api, or X-Forwarded-Proto from a proxy listed in
        # FORWARDED_ALLOW_IPS (docs/operations.md, "The console behind TLS").
        secure=request.url.scheme == "https",
        path=COOKIE_PATH,
    )
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    await read_form(request, await session_of(request, reading=False))
    await end_session(request)
    log.info("console sign-out", extra={"event": "console.sign_out"})
    response = RedirectResponse("/console/login", status_code=303)
    response.delete_cookie(COOKIE, path=COOKIE_PATH)
    return response


# --- jobs -------------------------------------------------------------------------------------


@router.get("/jobs")
async def jobs_page(request: Request) -> HTMLResponse:
    session = await session_of(request)
    store = store_of(request)
    filters = _filters(request)
    job_filters = _job_filters(session, filters)
    counts = await reads.job_counts(store, session.principal, job_filters)
    found = await reads.jobs_page(
        store,
        session.principal,
        job_filters,
        after=page_start(request),
        limit=PAGE_SIZE,
    )
    page = found.items
    next_query = older_query(filters, found, lambda job: (job.created_at, job.job_id))
    return render(
        "jobs.html",
        session=session,
        jobs=page,
        counts=[(status, counts.get(status, 0)) for status in STATUSES],
        counted=sum(counts.values()),
        window=reads.CONSOLE_WINDOW,
        filters=filters,
        statuses=STATUSES,
        lanes=LANES,
        kinds=KINDS,
        next_query=next_query,
    )


@router.get("/jobs/{jobId:path}/events")
async def job_events(request: Request, jobId: str) -> Response:
    """The job's receipts as a live event stream, authenticated by the console session; it
    counts against the session token's cap of open streams like any other."""
    session = await session_of(request)
    store = store_of(request)
    job = await _find_job(store, session.principal, jobId)
    if job is None:
        return Response("no such job", status_code=404)
    after = parse_seq(request.query_params.get("after") or "0", "after")
    resume = parse_last_event_id(request.headers.get("last-event-id"), after)
    followed = as_seen_by(session.principal, followed_job(job, shown_id(session.principal, job)))
    state = request.app.state.api
    return stream_response(
        state, session.principal.token_id, followed, resume, alive=session_alive(request, store)
    )


@router.get("/jobs/{jobId:path}")
async def job_page(request: Request, jobId: str) -> HTMLResponse:
    session = await session_of(request)
    store = store_of(request)
    job = await _find_job(store, session.principal, jobId)
    if job is None:
        return render("missing.html", status=404, session=session, what=f"job {jobId}")
    # The newest receipts (a runaway job's thousands of progress lines must not hold its page,
    # and its Abort, in the past); the live stream goes on from the last of them.
    receipts = await reads.stream_tail(store, jobmodel.job_stream(job.job_id), TIMELINE_LIMIT)
    return render(
        "job.html",
        session=session,
        job=job,
        timeline=timeline(receipts, session.principal),
        attempts=attempts(receipts),
        output=progress_lines(receipts),
        last_seq=receipts[-1].seq if receipts else 0,
        command_types=COMMAND_TYPES,
        # Names the commands this page's forms send: a form sent again appends nothing more.
        form_key=uuid.uuid4().hex,
        temporal_url=temporal_workflows_url(request.app.state.api.core)
        + "?"
        + urlencode({"query": temporal_query(job)}),
        notice=notice_of(request, session),
        retryable=job.status in retries.RETRYABLE_STATUSES and job.kind != TURN_KIND,
    )


def temporal_query(job: Job) -> str:
    """The Temporal UI's search for every delivery of `job`: the id its caller chose and its
    organization (the search attributes the starter sets, workflows/driver.py)."""

    def literal(value: str) -> str:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'

    query = f"ReceiptJobId={literal(caller_id(job.job_id))}"
    if job.organization_id:
        query += f" AND ReceiptOrganizationId={literal(job.organization_id)}"
    return query


def _form_command_id(form_key: str, command_type: str, *words: str) -> str:
    """The command a job page's form sends: named by the page's key and what the form says (its
    type, payload and reason: one page sending a steer and an abort, or a second steer typed on
    a page left open), so the form sent again (its answer lost, a second click) is the same
    command; without a key, a new one."""
    if FORM_KEY.fullmatch(form_key):
        said = json.dumps([command_type, *words])
        return f"cmd-{keyed_id(f'{form_key}:{said}')}"
    return f"cmd-{uuid.uuid4()}"


@router.post("/jobs/{jobId:path}/command")
async def job_command(request: Request, jobId: str) -> Response:
    session = await session_of(request)
    fields = await read_form(request, session)
    command_type = fields.get("type", "")
    if command_type not in COMMAND_TYPES:
        raise FormError(422, f"type must be one of: {', '.join(COMMAND_TYPES)}")
    payload: Any = None
    text = fields.get("payload", "").strip()
    if command_type != "abort" and text:
        try:
            payload = loads(text)  # NaN or 1e400 is text, as in a body: jsonb stores neither
        except RecursionError:  # deeper than the parser goes: far past the depth limit
            raise FormError(422, "the payload is nested deeper than the API allows") from None
        except ValueError:
            payload = {"message": text}
        try:  # the API's limits on a JSON body (depth, size, text), as a POST of it has
            check_shape(payload, request.app.state.api.json_limits)
        except InvalidInput as exc:
            raise FormError(422, f"payload: {exc.message}") from None
    job = await _find_job(store_of(request), session.principal, jobId)
    need(session, JOBS_WRITE)
    if job is not None and command_type != "abort" and runs_commands(job.agent_id, job.kind):
        need(session, COMMANDS_RUN)
    settings = request.app.state.api.settings
    if len(json.dumps(payload)) + len(fields.get("reason", "")) > settings.max_command_bytes:
        raise FormError(
            422,
            f"a command holds at most {settings.max_command_bytes} bytes (RECEIPT_MAX_COMMAND_BYTES)",
        )
    if command_type != "abort":  # the organization's rate, as the API's steers
        request.app.state.api.org_limits.admit(session.principal.organization_id)
    outcome = await interventions.add_command(
        store_of(request),
        job.job_id if job is not None else jobId,
        type=command_type,
        payload=payload,
        reason=fields.get("reason") or None,
        organization_id=session.principal.organization_id,
        check_organization=not session.principal.admin,
        command_id=_form_command_id(
            fields.get("form", ""), command_type, text, fields.get("reason", "")
        ),
        max_commands=request.app.state.api.settings.max_commands_per_job,
        max_follow_up_bytes=request.app.state.api.settings.agent_job_max_follow_up_bytes,
    )
    log.info(
        "console command",
        extra={"event": "console.command", "jobId": jobId, "type": command_type},
    )
    appended = "already appended" if outcome.already else "appended"
    notice = (
        f"{command_type} {appended}" if outcome.ok else f"{command_type} refused: {outcome.status}"
    )
    return RedirectResponse(
        f"/console/jobs/{path_segment(jobId)}?{notice_query(session, notice)}", status_code=303
    )


@router.post("/jobs/{jobId:path}/retry")
async def job_retry(request: Request, jobId: str) -> Response:
    session = await session_of(request)
    await read_form(request, session)
    job = await _find_job(store_of(request), session.principal, jobId)
    need(session, JOBS_WRITE)
    if job is not None and runs_commands(job.agent_id, job.kind):
        need(session, COMMANDS_RUN)
    try:
        outcome = await retries.retry(
            store_of(request),
            job.job_id if job is not None else jobId,
            organization_id=session.principal.organization_id,
            admin=session.principal.admin,
            admission=_admission(request, session.principal),
            held=held_retry(request.app.state.api.settings),
        )
    except (ApiError, InvalidInput) as exc:  # the rate or caps, or a program off the list
        outcome = retries.RetryOutcome(exc.message)
    if outcome.retry is None:
        notice = f"not retried: {outcome.status}"
        return RedirectResponse(
            f"/console/jobs/{path_segment(jobId)}?{notice_query(session, notice)}",
            status_code=303,
        )
    shown = shown_job_id(job, session.principal.organization_id) if job is not None else jobId
    notice = f"retry of {shown}"
    return RedirectResponse(
        f"/console/jobs/{path_segment(outcome.retry.job_id)}?{notice_query(session, notice)}",
        status_code=303,
    )


# --- failed work ------------------------------------------------------------------------------


@router.get("/failed")
async def failed_page(request: Request) -> HTMLResponse:
    session = await session_of(request)
    groups = await reads.failed_groups(
        store_of(request),
        session.principal,
        request.query_params.get("agentId") or None,
        FAILED_GROUPS,
    )
    return render(
        "failed.html",
        session=session,
        groups=groups,
        window=reads.CONSOLE_WINDOW,
        agent_id=request.query_params.get("agentId") or "",
        notice=notice_of(request, session),
    )


@router.post("/failed/retry")
async def failed_retry(request: Request) -> Response:
    session = await session_of(request)
    fields = await read_form(request, session)
    need(session, JOBS_WRITE)
    need(session, COMMANDS_RUN)
    error = _group_error(fields.get("error"))
    stopped = ""
    try:
        outcomes = await retries.retry_matching(
            store_of(request),
            {
                "status": "failed",
                "agent_id": fields.get("agentId") or None,
                "error": error,
            },
            organization_id=session.principal.organization_id,
            admin=session.principal.admin,
            limit=retries.MAX_BULK,
            admission=_admission(request, session.principal),
            held=held_retry(request.app.state.api.settings),
        )
    except ApiError as exc:  # the organization's rate or caps: the retries made stand
        outcomes, stopped = [], f"; stopped: {exc.message}"
    created = sum(1 for o in outcomes if o.status == retries.RETRIED)
    log.info("console bulk retry", extra={"event": "console.bulk_retry", "count": created})
    notice = f"{created} job(s) retried{stopped}" if created or not stopped else stopped[2:]
    return RedirectResponse(f"/console/failed?{notice_query(session, notice)}", status_code=303)


def _group_error(field: str | None) -> str | None:
    """The error of a failed group, as its form carries it: a JSON string (a browser turns each
    line break of a field into CRLF, so the text itself would not match a traceback's jobs).
    None (every error) without the field."""
    if field is None:
        return None
    try:
        error = json.loads(field)
    except ValueError:
        error = None
    if not isinstance(error, str):
        raise FormError(422, "error must be the group's error as a JSON string")
    return error


def _admission(request: Request, principal: Principal) -> Admission | None:
    """An organization's retries from the console take its rate and count against its caps, as
    the API's do (an admin's are the operator's own); a refusal raises the API's 429."""
    state = request.app.state.api
    caps = caller_caps(state.settings, principal)
    if caps is not None:
        state.org_limits.admit(principal.organization_id)
    return caps


# --- wiring -----------------------------------------------------------------------------------
