"""Retry routes: `POST /jobs/{jobId}/retry` and the bounded, idempotent bulk `POST /jobs/retry`."""

from __future__ import annotations

import logging
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from receipts import retry as retries
from receipts.jobs import LANES
from receipts.kinds import KINDS, runs_commands
from roles.api.admission import caller_caps, held_retry
from roles.api.auth import COMMANDS_RUN, JOBS_WRITE
from roles.api.body import choice, validated
from roles.api.deps import (
    ApiError,
    Caller,
    JobId,
    State,
    read_json_body,
    require_scope,
    shown_id,
    visible_job,
)
from roles.api.schema import JobView, errors_documented, job_view, json_body_documented

log = logging.getLogger("roles.api.retry")

router = APIRouter(tags=["jobs"])


class RetryAccepted(BaseModel):
    """A retry: the job retried and the job its retry created (`outcome`: `retried`, or
    `already_retried` when an earlier retry had created it)."""

    model_config = ConfigDict(populate_by_name=True, alias_generator=to_camel)

    outcome: Literal["retried", "already_retried"]
    job: JobView
    retry: JobView


class BulkRetryBody(BaseModel):
    """Which settled jobs to retry: a filter (null matches all) and a bound."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    status: Literal["failed", "canceled"] = "failed"
    agent_id: str | None = Field(default=None, min_length=1, max_length=200)
    kind: str | None = Field(default=None, min_length=1, max_length=200)
    lane: str | None = Field(default=None, min_length=1, max_length=20)
    error: str | None = Field(default=None, min_length=1, max_length=2_000)
    organization_id: str | None = Field(default=None, min_length=1, max_length=200)
    limit: int = Field(default=100, ge=1, le=retries.MAX_BULK)


class BulkRetried(BaseModel):
    """What a bulk retry created: one entry per job retried (`jobId` → `retryJobId`)."""

    retried: list[dict[str, str]]
    count: int


def _refusal(outcome: retries.RetryOutcome, job_id: str) -> ApiError:
    if outcome.status == retries.NOT_FOUND:
        return ApiError(404, "not_found", f"no job {job_id!r}", field="jobId")
    if outcome.status == retries.AGENT_TURN:
        return ApiError(
            409,
            "not_retryable",
            f"job {job_id!r} is a turn of an agent job: its agent job retries its turns "
            "(POST /agent-jobs to run it again), not one by one",
        )
    status = outcome.job.status if outcome.job else "active"
    return ApiError(
        409,
        "not_retryable",
        f"job {job_id!r} is {status}; only {' or '.join(retries.RETRYABLE_STATUSES)} jobs are "
        "retried",
        allowed=retries.RETRYABLE_STATUSES,
    )


@router.post(
    "/jobs/retry",
    response_model=BulkRetried,
    responses=errors_documented(400, 401, 403, 413, 415, 422, 429, 503),
    openapi_extra=json_body_documented("BulkRetryBody"),
)
async def retry_matching(request: Request, state: State, caller: Caller) -> JSONResponse:
    """Retry every failed (or canceled) job that matches the filter and was never retried, at
    most `limit` (≤ 500). Running it twice creates nothing new. It may re-run commands, so the
    token needs `commands:run` as well as `jobs:write`."""
    require_scope(caller, JOBS_WRITE)
    require_scope(caller, COMMANDS_RUN)
    raw = await read_json_body(request, state.settings.max_body_bytes, state.json_limits)
    body = validated(BulkRetryBody, raw)
    choice(body.lane, "lane", LANES)
    choice(body.kind, "kind", KINDS)
    await state.org_limits.admit_paced(caller.organization_id)
    outcomes = await retries.retry_matching(
        state.require_store(),
        {
            "status": body.status,
            "agent_id": body.agent_id,
            "kind": body.kind,
            "lane": body.lane,
            "error": body.error,
            "organization_id": body.organization_id,
        },
        organization_id=caller.organization_id,
        admin=caller.admin,
        limit=body.limit,
        admission=caller_caps(state.settings, caller),
        held=held_retry(state.settings),
    )
    retried = [
        {"jobId": shown_id(caller, o.job), "retryJobId": shown_id(caller, o.retry)}
        for o in outcomes
        if o.status == retries.RETRIED and o.job is not None and o.retry is not None
    ]
    log.info("bulk retry", extra={"event": "api.bulk_retry", "count": len(retried)})
    return JSONResponse({"retried": retried, "count": len(retried)})


@router.post(
    "/jobs/{jobId:path}/retry",
    response_model=RetryAccepted,
    status_code=201,
    responses={
        200: {"model": RetryAccepted, "description": "An earlier retry had created it"},
        **errors_documented(401, 403, 404, 409, 415, 422, 429, 503),
    },
)
async def retry_job(state: State, caller: Caller, job_id: JobId) -> JSONResponse:
    """Retry a failed or canceled job: a new job with its payload and route (`retryOf`), and a
    `job.retried` receipt on the old one, which stays terminal. 201 when created, 200 when an
    earlier retry had created it."""
    require_scope(caller, JOBS_WRITE)
    job = await visible_job(state, caller, job_id)
    if runs_commands(job.agent_id, job.kind):
        require_scope(caller, COMMANDS_RUN)
    await state.org_limits.admit_paced(caller.organization_id)
    outcome = await retries.retry(
        state.require_store(),
        job.job_id,
        organization_id=caller.organization_id,
        admin=caller.admin,
        admission=caller_caps(state.settings, caller),
        held=held_retry(state.settings),
    )
    if outcome.status not in (retries.RETRIED, retries.ALREADY) or outcome.retry is None:
        raise _refusal(outcome, job_id)
    assert outcome.job is not None
    return JSONResponse(
        {
            "outcome": outcome.status,
            "job": job_view(outcome.job, shown_id(caller, outcome.job)),
            "retry": job_view(outcome.retry, shown_id(caller, outcome.retry)),
        },
        status_code=201 if outcome.status == retries.RETRIED else 200,
    )
