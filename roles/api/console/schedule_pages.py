"""Console pages of schedules: the organization's schedules with their next fire time and last
run (its job linked), and pause / resume, each a CSRF-checked form recorded as a receipt."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from receipts.errors import InvalidInput
from receipts.schedules import cron
from receipts.schedules import store as schedules
from receipts.schedules.model import ScheduleState
from roles.api.auth import JOBS_WRITE
from roles.api.console.pages import PAGE_SIZE, render, store_of
from roles.api.console.paging import older_query, page_start
from roles.api.console.session import form_of, notice_of, notice_query, session_of, visible
from roles.api.errors import ApiError
from roles.api.routes.schedules import admitted, current_fields

log = logging.getLogger("roles.api.console")

router = APIRouter(prefix="/console/schedules", include_in_schema=False)


def next_fire(schedule: ScheduleState) -> str:
    """The next fire time as the page shows it (`paused` while paused)."""
    if schedule.status != "active":
        return schedule.status
    found = cron.next_times(
        cron=schedule.cron,
        interval_s=schedule.interval_s,
        timezone=schedule.timezone,
        after=datetime.now(UTC),
        count=1,
    )
    return found[0].isoformat(timespec="seconds") if found else "never"


@router.get("")
async def schedules_page(request: Request) -> HTMLResponse:
    session = await session_of(request)
    page = await schedules.schedules_page(
        store_of(request), session.principal, after=page_start(request), limit=PAGE_SIZE
    )
    return render(
        "schedules.html",
        session=session,
        schedules=[(s, next_fire(s)) for s in page.items],
        notice=notice_of(request, session),
        next_query=older_query({}, page, lambda s: (s.created_at, s.schedule_id)),
    )


@router.post("/{scheduleId}/{action}")
async def schedule_action(request: Request, scheduleId: str, action: str) -> Response:
    """Pause or resume a schedule (the API's PATCH, from a form)."""
    session, fields = await form_of(request, JOBS_WRITE)
    store = store_of(request)
    schedule = visible(session, await schedules.get(store, scheduleId), f"schedule {scheduleId}")
    refused = None
    if action == "resume" and schedule.status == "paused":
        # A resume starts firings again: the caller must hold what enqueueing them needs, as
        # for the API's PATCH (`commands:run` for a schedule whose jobs run commands).
        try:
            admitted(request.app.state.api, session.principal, current_fields(schedule))
        except (ApiError, InvalidInput) as exc:
            refused = exc.message
    if refused is None and action in ("pause", "resume"):
        # Each change is work for the schedule sync: one of the organization's enqueue tokens,
        # as the API's PATCH takes.
        try:
            request.app.state.api.org_limits.admit(schedule.organization_id)
        except ApiError as exc:
            refused = exc.message
    if action not in ("pause", "resume"):
        notice = f"unknown action {action!r}: pause or resume"
    elif refused is not None:
        notice = f"schedule {schedules.shown_id(schedule)} not {action}d: {refused}"
    else:
        reason = (fields.get("reason") or "")[:1000]
        # A pause of a paused schedule keeps its note unless a reason is typed.
        note = reason or (None if schedule.status == "paused" else "paused from the console")
        shown = schedules.shown_id(schedule)
        try:
            # A resume was admitted on the definition as read: one changed since is not resumed.
            changed = await schedules.change(
                store,
                schedule.schedule_id,
                paused=action == "pause",
                note=note,
                based_on=schedule.definition_seq,
            )
            notice = f"schedule {shown}: {action}d" if changed else f"schedule {shown} is deleted"
        except schedules.DefinitionMoved:
            notice = f"schedule {shown} not {action}d: it changed meanwhile; try again"
        log.info(
            "console schedule %s",
            action,
            extra={"event": f"console.schedule_{action}", "scheduleId": schedule.schedule_id},
        )
    return RedirectResponse(f"/console/schedules?{notice_query(session, notice)}", 303)
