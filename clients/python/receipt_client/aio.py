"""`AsyncClient`: the Receipt API from asyncio code. Generated from `sync.py` by `make client`
(tools/client_models.py): do not edit by hand."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

from receipt_client import _calls as calls
from receipt_client import models
from receipt_client._aio_base import AsyncBaseClient
from receipt_client._calls import Call
from receipt_client.deadline import TERMINAL_STATUSES, Deadline, objective_ended
from receipt_client.errors import (
    ObjectiveNotCreated,
)


class AsyncClient(AsyncBaseClient):
    """An asyncio client of the Receipt API.

    `url` defaults to `RECEIPT_API_URL` (else http://127.0.0.1:8000), `token` to
    `RECEIPT_API_TOKEN`. Every refusal raises a `ReceiptError` subclass carrying the API's
    error (`NotFound`, `Conflict`, `InvalidInput`, `RateLimited`, …); an unreachable API raises
    `ConnectionFailed`. Use it as an async context manager, or call `close()`.
    """

    # --- jobs -----------------------------------------------------------------------------

    async def enqueue(
        self,
        agent_id: str,
        payload: Mapping[str, Any],
        *,
        job_id: str | None = None,
        idempotency_key: str | None = None,
        session_key: str | None = None,
        lane: calls.Lane | None = None,
        singleton_mode: calls.SingletonMode | None = None,
        max_attempts: int | None = None,
        delay_ms: int | None = None,
    ) -> models.EnqueueAccepted:
        """Enqueue a job for `agent_id` (`POST /agents/{agentId}/jobs`). A `job_id` (or an
        `idempotency_key`) makes a repeated call find the same job."""
        return await self._send(
            calls.enqueue(
                agent_id,
                payload,
                job_id=job_id,
                idempotency_key=idempotency_key,
                session_key=session_key,
                lane=lane,
                singleton_mode=singleton_mode,
                max_attempts=max_attempts,
                delay_ms=delay_ms,
            )
        )

    async def get_job(self, job_id: str) -> models.JobView:
        return await self._send(Call("GET", calls.job_path(job_id), models.JobView))

    async def list_jobs(
        self,
        *,
        status: calls.JobStatus | None = None,
        agent_id: str | None = None,
        lane: calls.Lane | None = None,
        kind: str | None = None,
        session_key: str | None = None,
        organization_id: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> models.JobList:
        """One page of jobs, newest first; pass its `next_cursor` back for the next."""
        params = calls.query(
            status=status,
            agentId=agent_id,
            lane=lane,
            kind=kind,
            sessionKey=session_key,
            organizationId=organization_id,
            limit=limit,
            cursor=cursor,
        )
        return await self._send(Call("GET", "/jobs", models.JobList, params=params))

    async def iter_jobs(
        self, cursor: str | None = None, **filters: Any
    ) -> AsyncIterator[models.JobView]:
        """Every job matching `filters` (those of `list_jobs`), following the cursor from
        `cursor` (a page's `next_cursor`: resume where an earlier listing stopped)."""
        while True:
            page = await self.list_jobs(**filters, cursor=cursor)
            for job in page.jobs:
                yield job
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def command(
        self,
        job_id: str,
        type: calls.CommandType,
        payload: Any = None,
        *,
        reason: str | None = None,
        idempotency_key: str | None = None,
    ) -> models.CommandAccepted:
        """Send a `steer`, `follow_up` or `abort` command to a job that is not terminal. An
        `idempotency_key` makes a repeated call find the same command."""
        return await self._send(calls.command(job_id, type, payload, reason, idempotency_key))

    async def steer(
        self, job_id: str, payload: Any, *, idempotency_key: str | None = None
    ) -> models.CommandAccepted:
        return await self.command(job_id, "steer", payload, idempotency_key=idempotency_key)

    async def follow_up(
        self, job_id: str, payload: Any, *, idempotency_key: str | None = None
    ) -> models.CommandAccepted:
        return await self.command(job_id, "follow_up", payload, idempotency_key=idempotency_key)

    async def abort(
        self, job_id: str, reason: str | None = None, *, idempotency_key: str | None = None
    ) -> models.CommandAccepted:
        return await self.command(job_id, "abort", reason=reason, idempotency_key=idempotency_key)

    async def retry(self, job_id: str) -> models.RetryAccepted:
        """Retry a failed or canceled job (a new job; a repeated call finds the same one)."""
        return await self._send(
            Call("POST", calls.job_path(job_id, "/retry"), models.RetryAccepted)
        )

    async def retry_matching(self, **filters: Any) -> models.BulkRetried:
        """Retry the failed (or canceled) jobs matching `filters` (`BulkRetryBody`'s fields; one
        given as None is left out)."""
        body = models.BulkRetryBody.model_validate(calls.query(**filters)).model_dump(
            by_alias=True, exclude_none=True
        )
        return await self._send(Call("POST", "/jobs/retry", models.BulkRetried, body=body))

    async def job_events(
        self, job_id: str, after: int = 0, limit: int | None = None
    ) -> models.EventsPage:
        params = calls.query(after=after, limit=limit)
        return await self._send(
            Call("GET", calls.job_path(job_id, "/events"), models.EventsPage, params=params)
        )

    async def receipts(self, job_id: str, after: int = 0) -> AsyncIterator[models.ReceiptView]:
        """Every receipt of the job past `after`, from its JSON pages (no waiting)."""
        async for body in self.pages(calls.job_path(job_id, "/events"), after):
            yield models.ReceiptView.model_validate(body)

    async def follow(self, job_id: str, after: int = 0) -> AsyncIterator[models.ReceiptView]:
        """The job's receipts past `after` as they are written, until it is terminal."""
        async for body in self.follow_raw(calls.job_path(job_id, "/events"), after, job_id):
            yield models.ReceiptView.model_validate(body)

    async def wait(self, job_id: str, timeout: float | None = None) -> models.JobView:
        """Follow the job's event stream (resuming across disconnects) until it is terminal,
        and return it (read again through an api restart too). `timeout` (seconds): raise
        `WaitTimedOut` if it has not ended by then (the job goes on)."""
        deadline = Deadline.after(timeout, f"job {job_id}")
        path = calls.job_path(job_id)
        job = await self._read_through_outages(Call("GET", path, models.JobView), deadline)
        if job.status in TERMINAL_STATUSES:
            return job
        # From where the job is: a long history is not read again (nor held against `timeout`).
        events = calls.job_path(job_id, "/events")
        async for _ in self.follow_raw(events, job.seq or 0, job_id, deadline):
            pass
        return await self._read_through_outages(Call("GET", path, models.JobView), deadline)

    # --- objectives -----------------------------------------------------------------------

    async def create_objective(
        self, spec: calls.Body | str | os.PathLike[str], *, idempotency_key: str | None = None
    ) -> models.ObjectiveAccepted:
        """Create an objective (`ObjectiveBody`, or a dict) or read it from a JSON/YAML file.
        Its `objectiveId` (or an `idempotency_key`) makes a repeated call find the same one."""
        body = calls.objective_body(spec)
        headers = calls.keyed(idempotency_key)
        return await self._send(
            Call("POST", "/objectives", models.ObjectiveAccepted, body=body, headers=headers)
        )

    async def get_objective(self, objective_id: str) -> models.ObjectiveView:
        return await self._send(
            Call("GET", calls.objective_path(objective_id), models.ObjectiveView)
        )

    async def list_objectives(
        self,
        *,
        status: calls.ObjectiveStatus | None = None,
        organization_id: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> models.ObjectiveList:
        """One page of objectives, newest first; pass its `next_cursor` back for the next
        (`organization_id`: an admin token's choice of organization)."""
        params = calls.query(
            status=status, organizationId=organization_id, limit=limit, cursor=cursor
        )
        return await self._send(Call("GET", "/objectives", models.ObjectiveList, params=params))

    async def iter_objectives(
        self, cursor: str | None = None, **filters: Any
    ) -> AsyncIterator[models.ObjectiveSummary]:
        """Every objective matching `filters` (those of `list_objectives`), following the
        cursor from `cursor`."""
        while True:
            page = await self.list_objectives(**filters, cursor=cursor)
            for objective in page.objectives:
                yield objective
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def objective_events(
        self, objective_id: str, after: int = 0, limit: int | None = None
    ) -> models.ObjectiveEventsPage:
        path = calls.objective_path(objective_id, "/events")
        params = calls.query(after=after, limit=limit)
        return await self._send(Call("GET", path, models.ObjectiveEventsPage, params=params))

    async def follow_objective(
        self, objective_id: str, after: int = 0
    ) -> AsyncIterator[models.ReceiptView]:
        """The objective's receipts as they are written, until it is settled and audited."""
        path = calls.objective_path(objective_id, "/events")
        async for body in self.follow_raw(path, after, objective_id):
            yield models.ReceiptView.model_validate(body)

    async def cancel_objective(
        self, objective_id: str, reason: str | None = None
    ) -> models.ObjectiveCancelAccepted:
        path = calls.objective_path(objective_id, "/cancel")
        body = calls.reason_body(reason)
        return await self._send(Call("POST", path, models.ObjectiveCancelAccepted, body=body))

    async def wait_objective(
        self, objective: str | models.ObjectiveAccepted, timeout: float | None = None
    ) -> models.ObjectiveView:
        """Follow an objective through its settlement and audit, and return it. Given what
        `create_objective` answered, first wait for its `factory.run` job to create it (a planner
        may take a while); `ObjectiveNotCreated` names that job's error when it failed.
        `timeout` (seconds, the whole wait): raise `WaitTimedOut` if it has not ended by then."""
        objective_id = objective if isinstance(objective, str) else objective.objective_id
        deadline = Deadline.after(timeout, f"objective {objective_id}")
        if not isinstance(objective, str):
            run = await self.wait(objective.job.job_id, deadline.left())
            if run.status != "completed":
                raise ObjectiveNotCreated(
                    f"objective {objective_id} was not created: {run.error}", code=run.status
                )
        path = calls.objective_path(objective_id)
        found = await self._read_through_outages(Call("GET", path, models.ObjectiveView), deadline)
        if objective_ended(found):
            return found
        # From where the objective is: its history is not read again (nor held against `timeout`).
        async for _ in self.follow_raw(f"{path}/events", found.seq or 0, objective_id, deadline):
            pass
        return await self._read_through_outages(Call("GET", path, models.ObjectiveView), deadline)

    # --- schedules --------------------------------------------------------------------------

    async def create_schedule(
        self, body: calls.Body, *, idempotency_key: str | None = None
    ) -> models.ScheduleView:
        """Create a schedule (`ScheduleBody`); a re-post of its definition answers it as it is
        (without a `scheduleId`, an `idempotency_key` names it)."""
        body = calls.request_body(body)
        headers = calls.keyed(idempotency_key)
        return await self._send(
            Call("POST", "/schedules", models.ScheduleView, body=body, headers=headers)
        )

    async def get_schedule(self, schedule_id: str) -> models.ScheduleView:
        return await self._send(Call("GET", calls.schedule_path(schedule_id), models.ScheduleView))

    async def list_schedules(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> models.ScheduleList:
        params = calls.query(limit=limit, cursor=cursor)
        return await self._send(Call("GET", "/schedules", models.ScheduleList, params=params))

    async def update_schedule(self, schedule_id: str, **changes: Any) -> models.ScheduleView:
        """Change a schedule (`SchedulePatchBody`, by API names: `cron`, `interval`, `job`, …)."""
        path = calls.schedule_path(schedule_id)
        return await self._send(
            Call("PATCH", path, models.ScheduleView, body=calls.body_of(changes))
        )

    async def pause_schedule(
        self, schedule_id: str, note: str | None = None
    ) -> models.ScheduleView:
        return await self.update_schedule(schedule_id, paused=True, note=note)

    async def resume_schedule(self, schedule_id: str) -> models.ScheduleView:
        return await self.update_schedule(schedule_id, paused=False)

    async def delete_schedule(self, schedule_id: str) -> None:
        """Delete a schedule: it fires no more (the jobs it enqueued are left as they are)."""
        await self.request("DELETE", calls.schedule_path(schedule_id))

    # --- background agent jobs ------------------------------------------------------------

    async def create_agent_job(self, body: calls.Body) -> models.AgentJobAnswer:
        """Create a background agent job (`AgentJobCreateBody`); a repeated tool call finds it."""
        body = calls.request_body(body)
        return await self._send(Call("POST", "/agent-jobs", models.AgentJobAnswer, body=body))

    async def get_agent_job(self, agent_job_id: str) -> models.AgentJobView:
        return await self._send(
            Call("GET", calls.agent_job_path(agent_job_id), models.AgentJobView)
        )

    async def answer_agent_job(
        self, agent_job_id: str, answer: Any, *, tool_call_id: str | None = None
    ) -> models.AgentJobAnswer:
        """Answer the question of a job waiting on its user."""
        body = calls.body_of({"answer": answer, "toolCallId": tool_call_id})
        body.setdefault("answer", None)
        path = calls.agent_job_path(agent_job_id, "/input")
        return await self._send(Call("POST", path, models.AgentJobAnswer, body=body))

    async def cancel_agent_job(
        self, agent_job_id: str, reason: str | None = None
    ) -> models.AgentJobAnswer:
        """Stop the job (a running turn finishes on its own, its outcome discarded)."""
        path = calls.agent_job_path(agent_job_id, "/cancel")
        body = calls.reason_body(reason)
        return await self._send(Call("POST", path, models.AgentJobAnswer, body=body))

    async def agent_job_events(
        self, agent_job_id: str, after: int = 0, limit: int | None = None
    ) -> models.AgentJobEventsPage:
        path = calls.agent_job_path(agent_job_id, "/events")
        params = calls.query(after=after, limit=limit)
        return await self._send(Call("GET", path, models.AgentJobEventsPage, params=params))

    async def follow_agent_job(
        self, agent_job_id: str, after: int = 0
    ) -> AsyncIterator[models.ReceiptView]:
        """The agent job's receipts as they are written, until it is finished."""
        path = calls.agent_job_path(agent_job_id, "/events")
        async for body in self.follow_raw(path, after, agent_job_id):
            yield models.ReceiptView.model_validate(body)

    async def session_agent_jobs(
        self,
        session_id: str,
        *,
        status: calls.AgentJobStatus | None = None,
        agent_id: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> models.AgentJobList:
        """The owner session's agent jobs, newest first (`GET /sessions/{id}/agent-jobs`)."""
        params = calls.query(status=status, agentId=agent_id, limit=limit, cursor=cursor)
        path = calls.session_path(session_id, "/agent-jobs")
        return await self._send(Call("GET", path, models.AgentJobList, params=params))

    async def console_agent_jobs(
        self,
        *,
        status: calls.AgentJobStatus | None = None,
        agent_id: str | None = None,
        owner_session_id: str | None = None,
        organization_id: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> models.AgentJobList:
        """Every organization's agent jobs, newest first (`GET /console/agent-jobs`, admin)."""
        params = calls.query(
            status=status,
            agentId=agent_id,
            ownerSessionId=owner_session_id,
            organizationId=organization_id,
            limit=limit,
            cursor=cursor,
        )
        return await self._send(
            Call("GET", "/console/agent-jobs", models.AgentJobList, params=params)
        )

    async def console_agent_job(self, agent_job_id: str) -> models.AgentJobDetail:
        """An agent job with its turns, wakeups and receipts (admin)."""
        path = "/console" + calls.agent_job_path(agent_job_id)
        return await self._send(Call("GET", path, models.AgentJobDetail))

    async def console_cancel_agent_job(
        self, agent_job_id: str, reason: str | None = None
    ) -> models.AgentJobAnswer:
        """An operator's cancel of any organization's agent job (admin)."""
        path = "/console" + calls.agent_job_path(agent_job_id, "/cancel")
        body = calls.reason_body(reason)
        return await self._send(Call("POST", path, models.AgentJobAnswer, body=body))

    # --- owner sessions -------------------------------------------------------------------

    async def session_events(
        self, session_id: str, after: int = 0, limit: int | None = None
    ) -> models.SessionEventsPage:
        params = calls.query(after=after, limit=limit)
        path = calls.session_path(session_id, "/events")
        return await self._send(Call("GET", path, models.SessionEventsPage, params=params))

    async def follow_session(
        self, session_id: str, after: int = 0
    ) -> AsyncIterator[models.ReceiptView]:
        """The session's wakeups as they are written (a session never ends: stop when done)."""
        async for body in self.follow_raw(
            calls.session_path(session_id, "/events"), after, session_id
        ):
            yield models.ReceiptView.model_validate(body)

    # --- per-organization webhooks --------------------------------------------------------

    async def create_webhook(
        self,
        url: str,
        events: list[str],
        *,
        description: str | None = None,
        organization_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> models.WebhookCreated:
        """Subscribe `url` to `events` of the token's organization (an admin token names it:
        `organization_id`); the answer's `secret` (Standard Webhooks, `whsec_…`) is shown this
        once, and to a repeated call with the same `idempotency_key` (the same subscription)."""
        body = calls.body_of(
            {
                "url": url,
                "events": list(events),
                "description": description,
                "organizationId": organization_id,
            }
        )
        headers = calls.keyed(idempotency_key)
        return await self._send(
            Call("POST", "/webhooks", models.WebhookCreated, body=body, headers=headers)
        )

    async def list_webhooks(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> models.WebhookList:
        params = calls.query(limit=limit, cursor=cursor)
        return await self._send(Call("GET", "/webhooks", models.WebhookList, params=params))

    async def get_webhook(self, webhook_id: str) -> models.WebhookView:
        return await self._send(Call("GET", calls.webhook_path(webhook_id), models.WebhookView))

    async def delete_webhook(self, webhook_id: str) -> None:
        """Unsubscribe: the deliveries it still owes are dropped with it."""
        await self.request("DELETE", calls.webhook_path(webhook_id))

    async def rotate_webhook_secret(self, webhook_id: str) -> models.WebhookCreated:
        """A new signing secret (shown this once); the old one verifies no later post."""
        path = calls.webhook_path(webhook_id, "/rotate-secret")
        return await self._send(Call("POST", path, models.WebhookCreated))

    async def test_webhook(self, webhook_id: str) -> models.WebhookTestAccepted:
        """Have a `webhook.test` event delivered to the subscription."""
        path = calls.webhook_path(webhook_id, "/test")
        return await self._send(Call("POST", path, models.WebhookTestAccepted))

    async def webhook_deliveries(
        self, webhook_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> models.WebhookDeliveryList:
        """The subscription's deliveries, newest first: status, tries, the next try."""
        params = calls.query(limit=limit, cursor=cursor)
        path = calls.webhook_path(webhook_id, "/deliveries")
        return await self._send(Call("GET", path, models.WebhookDeliveryList, params=params))
