"""The operator console's agent-job routes (admin tokens only): every organization's jobs, one
job with its session's wakeups, an operator's cancel. The organizations' routes are in
roles/api/routes/agent_jobs.py."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from receipts.agent_jobs import model as agent_model
from receipts.agent_jobs import reads as agent_reads
from receipts.jobs import job_stream
from roles.api.deps import Caller, State
from roles.api.deps import takes_query as _takes_query
from roles.api.routes.agent_jobs import (
    LIST_QUERY,
    STATUS_QUERY,
    AgentJobId,
    agent_job_view,
    agent_jobs_page,
    cancel_answer,
    require_admin,
    visible_agent_job,
)
from roles.api.schema import (
    AgentJobAnswer,
    AgentJobDetail,
    AgentJobList,
    errors_documented,
    json_body_documented,
)

router = APIRouter(tags=["agent-jobs"])


@router.get(
    "/console/agent-jobs",
    response_model=AgentJobList,
    responses=errors_documented(401, 403, 422, 503),
    dependencies=[_takes_query(*LIST_QUERY)],
)
async def console_list(
    request: Request,
    state: State,
    caller: Caller,
    status: Annotated[str | None, STATUS_QUERY] = None,
    agent_id: Annotated[str | None, Query(alias="agentId", max_length=200)] = None,
    owner_session_id: Annotated[str | None, Query(alias="ownerSessionId", max_length=200)] = None,
    organization_id: Annotated[str | None, Query(alias="organizationId", max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=1000)] = None,
) -> JSONResponse:
    """Every organization's agent jobs, newest first, with filters and a cursor."""
    require_admin(caller)
    return await agent_jobs_page(
        request, state, caller, status, agent_id, owner_session_id, organization_id, limit, cursor
    )


@router.get(
    "/console/agent-jobs/{agentJobId}",
    response_model=AgentJobDetail,
    responses=errors_documented(401, 403, 404, 422, 503),
    dependencies=[_takes_query()],
)
async def console_show(
    request: Request, state: State, caller: Caller, agent_job_id: AgentJobId
) -> JSONResponse:
    """State, attempts (the turns' queue jobs), latest status, wakeups and the receipts."""
    require_admin(caller)
    job = await visible_agent_job(state, caller, agent_job_id)
    store = state.require_store()
    turns = []
    for queue_id in job.queue_job_ids:
        turn_job = await store.get_job(queue_id)
        turns.append(
            {
                "jobId": queue_id,
                "stream": job_stream(queue_id),
                "status": turn_job.status if turn_job else None,
                "result": turn_job.result if turn_job else None,
                "error": turn_job.error if turn_job else None,
            }
        )
    # By the wakeup rows: a long-lived session's stream (a Slack channel's) holds far more than
    # one read of it, and a newer job's wakeups fell past it.
    wakeups = [r.to_json() for r in await agent_reads.wakeups_of(store, job.agent_job_id)]
    receipts = await store.read_stream(agent_model.stream_of(job.agent_job_id))
    return JSONResponse(
        {
            "agentJob": agent_job_view(job, request, caller),
            "turns": turns,
            "wakeups": wakeups,
            "receipts": [r.to_json() for r in receipts],
        }
    )


@router.post(
    "/console/agent-jobs/{agentJobId}/cancel",
    response_model=AgentJobAnswer,
    status_code=202,
    responses=errors_documented(400, 401, 403, 404, 409, 413, 415, 422, 429, 503),
    openapi_extra=json_body_documented("AgentJobCancelBody", required=False),
    dependencies=[_takes_query()],
)
async def console_cancel(
    request: Request, state: State, caller: Caller, agent_job_id: AgentJobId
) -> JSONResponse:
    """An operator's cancel (any organization's job): as `POST /agent-jobs/{agentJobId}/cancel`."""
    require_admin(caller)
    return await cancel_answer(request, state, caller, agent_job_id, "canceled by an operator")
