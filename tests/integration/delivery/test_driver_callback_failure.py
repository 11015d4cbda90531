"""A callback activity that fails as a whole (not one URL's post: the activity itself, e.g. its
claim could not be written) changes nothing of the job, and the driver says which post it lost:
`callback.activity_failed` with the job and the event. The driver runs on a real Temporal dev
server; its activities are stand-ins, so only the workflow's own handling is under test."""

from __future__ import annotations

import logging
import uuid

import pytest
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from activities.names import EXECUTE_ATTEMPT, POST_CALLBACKS
from receipts.messages import (
    AttemptInput,
    AttemptResult,
    CallbackRequest,
    DriverAction,
    DriverInput,
    DriverPlan,
)
from roles.delivery.runtime import WORKFLOW_RUNNER
from workflows.driver import JobDriver

posted: list[str] = []


@activity.defn(name=POST_CALLBACKS)
async def post_callbacks_down(request: CallbackRequest) -> None:
    posted.append(request.event)
    raise ApplicationError("the claim could not be written", non_retryable=True)


@activity.defn(name=EXECUTE_ATTEMPT)
async def execute_attempt_completes(attempt: AttemptInput) -> AttemptResult:
    return AttemptResult("completed", job_status="completed")


async def test_a_failed_callback_activity_is_logged_by_event_and_the_job_still_ends(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    queue = f"callback-down-{uuid.uuid4().hex[:8]}"
    job_id = f"cb-{uuid.uuid4().hex[:8]}"
    plan = DriverPlan(
        DriverAction.DISPATCH,
        job_status="queued",
        attempt=1,
        task_queue=queue,
        agent_id="agent",
        lane="default",
        kind="noop",
        lease_ms=30_000,
        execution_timeout_ms=29_000,
        heartbeat_ms=10_000,
        driver_timeout_ms=120_000,
    )
    caplog.set_level(logging.WARNING, logger="temporalio.workflow")
    async with Worker(
        client,
        task_queue=queue,
        workflows=[JobDriver],
        activities=[post_callbacks_down, execute_attempt_completes],
        workflow_runner=WORKFLOW_RUNNER,
    ):
        status = await client.execute_workflow(
            JobDriver.run,
            DriverInput(job_id, callbacks=True, dispatched_beside=True, plan=plan),
            id=job_id,
            task_queue=queue,
        )
    assert status == "completed"
    assert sorted(posted) == ["completed", "dispatched"]
    failed = [r for r in caplog.records if getattr(r, "event", None) == "callback.activity_failed"]
    assert sorted((r.jobId, r.callback) for r in failed) == [  # type: ignore[attr-defined]
        (job_id, "completed"),
        (job_id, "dispatched"),
    ]
