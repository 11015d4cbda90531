"""Console pages of background agent jobs: a list, and a page per job with its pending question
(answered from a form), its turns (linked queue jobs), the wakeups sent to its owner, and cancel.

The JSON operator routes of the agent-job layer own `/console/agent-jobs` (admin tokens); these
pages live at `/console/agents/jobs` and follow the console's session rules (an organization's
token sees its organization's jobs).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from receipts import reads
from receipts.agent_jobs import interventions, lifecycle
from receipts.agent_jobs import model as agent_model
from receipts.agent_jobs import reads as agent_reads
from receipts.errors import NotFoundError
from receipts.objectives import store as objectives
from roles.api.auth import COMMANDS_RUN, JOBS_WRITE
from roles.api.body import path_segment
from roles.api.console.pages import PAGE_SIZE, TIMELINE_LIMIT, render, store_of
from roles.api.console.paging import older_query, page_start
from roles.api.console.receipt_rows import timeline
from roles.api.console.session import (
    FormError,
    Session,
    form_of,
    need,
    notice_of,
    notice_query,
    session_of,
    visible,
)
from roles.api.routes.sessions import runtime_session_id

log = logging.getLogger("roles.api.console")

TURNS_SHOWN = 200  # the newest turns of an agent job its page lists

router = APIRouter(prefix="/console/agents", include_in_schema=False)


def _page_url(session: Session, agent_job_id: str, notice: str) -> str:
    return f"/console/agents/jobs/{path_segment(agent_job_id)}?{notice_query(session, notice)}"


@router.get("/jobs")
async def agent_jobs_page(request: Request) -> HTMLResponse:
    session = await session_of(request)
    status = request.query_params.get("status") or None
    status = status if status in agent_model.STATUSES else None
    agent_id = request.query_params.get("agentId") or None
    owner = request.query_params.get("ownerSessionId") or None
    store = store_of(request)
    organization_id = session.principal.organization_id
    page = await agent_reads.jobs_page(
        store,
        session.principal,
        status=status,
        agent_id=agent_id,
        # An organization names its sessions as the API shows them (the runtime's id is tagged).
        owner_session_id=(
            await runtime_session_id(store, organization_id, owner)
            if owner and not session.principal.admin and organization_id
            else owner
        ),
        after=page_start(request),
        limit=PAGE_SIZE,
    )
    jobs = page.items
    filters = {"status": status, "agentId": agent_id, "ownerSessionId": owner}
    running = await agent_reads.running_by_agent(store) if session.principal.admin else []
    return render(
        "agent_jobs.html",
        session=session,
        jobs=jobs,
        statuses=agent_model.STATUSES,
        status_filter=status or "",
        agent_id=agent_id or "",
        running=running,
        slots=agent_model.SLOTS_PER_AGENT,
        next_query=older_query(
            {name: value for name, value in filters.items() if value},
            page,
            lambda job: (job.created_at, job.agent_job_id),
        ),
    )


@router.get("/jobs/{agentJobId}")
async def agent_job_page(request: Request, agentJobId: str) -> HTMLResponse:
    session = await session_of(request)
    store = store_of(request)
    job = visible(session, await lifecycle.get(store, agentJobId), f"agent job {agentJobId}")
    # The newest turns, read in one query, and the newest receipts: a job of thousands of turns
    # read each turn's job on its own and the oldest 10 000 of its receipts.
    shown_turns = job.queue_job_ids[-TURNS_SHOWN:]
    turn_jobs = await objectives.jobs_by_ids(store, shown_turns)
    turns: list[dict[str, Any]] = []
    for queue_id in shown_turns:
        turn_job = turn_jobs.get(queue_id)
        turns.append(
            {
                "job_id": queue_id,
                "status": turn_job.status if turn_job else "—",
                "error": (turn_job.error if turn_job else None) or "",
            }
        )
    # The job's own wakeups, by index (a long-lived session's stream is not read whole).
    wakeups = [
        {
            "seq": r.seq,
            "at": r.recorded_at.isoformat(timespec="seconds"),
            "status": r.data.get("status"),
            "source": r.data.get("sourceId"),
        }
        for r in await agent_reads.wakeups_of(store, job.agent_job_id)
    ]
    receipts = await reads.stream_tail(
        store, agent_model.stream_of(job.agent_job_id), TIMELINE_LIMIT
    )
    return render(
        "agent_job.html",
        session=session,
        job=job,
        latest=job.latest_status(),
        turns=turns,
        earlier_turns=len(job.queue_job_ids) - len(shown_turns),
        wakeups=wakeups,
        timeline=timeline(receipts, session.principal),
        input_text=json.dumps(job.input, ensure_ascii=False),
        notice=notice_of(request, session),
    )


@router.post("/jobs/{agentJobId}/answer")
async def agent_job_answer(request: Request, agentJobId: str) -> Response:
    session, fields = await form_of(request, JOBS_WRITE)
    need(session, COMMANDS_RUN)  # the answer is the input of a turn that runs commands
    store = store_of(request)
    visible(session, await lifecycle.get(store, agentJobId), f"agent job {agentJobId}")
    text = fields.get("answer", "").strip()
    if not text:
        raise FormError(422, "the answer is empty")
    try:
        job = await interventions.answer(
            store, agentJobId, answer=text, tool_call_id=fields.get("toolCallId") or None
        )
    except (interventions.NotWaiting, NotFoundError) as exc:
        return RedirectResponse(
            _page_url(session, agentJobId, f"not answered: {exc}"), status_code=303
        )
    log.info(
        "console answer", extra={"event": "console.agent_job_answered", "agentJobId": agentJobId}
    )
    return RedirectResponse(
        _page_url(session, agentJobId, f"answered; the job is {job.status}"), 303
    )


@router.post("/jobs/{agentJobId}/cancel")
async def agent_job_cancel(request: Request, agentJobId: str) -> Response:
    session, fields = await form_of(request, JOBS_WRITE)
    store = store_of(request)
    visible(session, await lifecycle.get(store, agentJobId), f"agent job {agentJobId}")
    reason = fields.get("reason") or "canceled from the console"
    try:
        job = await interventions.cancel(store, agentJobId, reason=reason[:1000])
    except interventions.AlreadyTerminal as exc:
        return RedirectResponse(
            _page_url(session, agentJobId, f"not canceled: {exc}"), status_code=303
        )
    log.info(
        "console cancel", extra={"event": "console.agent_job_cancel", "agentJobId": agentJobId}
    )
    return RedirectResponse(_page_url(session, agentJobId, job.status), status_code=303)
