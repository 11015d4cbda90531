"""What the failure paths log, and at which level (the log-events audit of 2026-12-07): a
tenant's refusals are logged once in a while, as every other limit's are."""

from __future__ import annotations

import logging
import uuid

import httpx
import pytest

from receipts import fairness
from receipts.agent_jobs import lifecycle
from receipts.agent_jobs.registry import AgentJobSettings
from receipts.kinds import QUEUE_CODEX
from receipts.store import Store
from roles.delivery.agent_jobs import AgentJobDispatcher
from tests.integration.api_support import AS_A, TOKEN_A, api_client, enqueue_body
from tests.integration.helpers import create_objective, new_id, put
from tests.integration.test_agent_jobs import request
from tests.integration.test_console import form, sign_in


def _events(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == event]


async def test_refusals_at_a_jobs_command_cap_are_logged_once_in_a_while(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Each refusal was a WARNING of its own: a tenant posting at a full job wrote a line per
    # post (20 here), where the other limits log once per 10 s per organization.
    caplog.set_level(logging.WARNING, logger="roles.api.app")
    async with api_client(db_url, max_commands_per_job=1) as client:
        job_id = (
            await client.post("/agents/codex/jobs", json=enqueue_body(), headers=AS_A)
        ).json()["job"]["jobId"]
        steer = {"type": "follow_up", "payload": {"text": "y"}}
        first = await client.post(f"/jobs/{job_id}/commands", json=steer, headers=AS_A)
        assert first.status_code == 202, first.text
        answers = [
            await client.post(f"/jobs/{job_id}/commands", json=steer, headers=AS_A)
            for _ in range(20)
        ]
    assert {a.status_code for a in answers} == {422}
    assert len(_events(caplog, "api.command_cap")) == 1


async def test_an_agent_job_held_at_its_organizations_cap_is_logged_once_in_a_while(
    fresh: tuple[Store, str], caplog: pytest.LogCaptureFixture
) -> None:
    # Each pass that found it held wrote an INFO line: a pass runs at least every 5 s and at any
    # job's settlement while one is held, so a held backlog wrote a line per job per pass.
    store, _ = fresh
    caplog.set_level(logging.INFO, logger="roles.delivery.agent_jobs")
    capped = AgentJobDispatcher(store, None, AgentJobSettings(), org_cap=1)
    task = (await put(store, org="org-a", payload_extra={"task": {"command": ["true"]}})).job
    taken = await fairness.claim(store, task, await store.now(), QUEUE_CODEX, 1)
    assert taken.step.name == "DELIVER"  # the organization's one codex slot is the task's
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    for _ in range(2):
        await lifecycle.create(store, request(agent))
    passes = [await capped.run_once() for _ in range(5)]
    assert [p.held for p in passes] == [2] * 5
    held = _events(caplog, "agent_job.held_back")
    logged = [(vars(r)["organizationId"], vars(r).get("unloggedSince")) for r in held]
    assert logged == [("org-a", 0)]


async def test_a_console_cancel_of_an_objective_names_the_objective(
    db_url: str, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    # Every other console action names what it acted on; this one said only that some
    # objective was canceled from the console.
    objective_id = await create_objective(store, f"o-log-{new_id()}")
    caplog.set_level(logging.INFO, logger="roles.api.console")
    async with api_client(db_url, store=store) as client:
        csrf = await sign_in(client, TOKEN_A)
        path = f"/console/objectives/{objective_id}/cancel"
        answer = await client.post(path, **form({"csrf": csrf, "reason": "r"}))  # type: ignore[arg-type]
        assert answer.status_code == 303, answer.text
    [canceled] = _events(caplog, "console.objective_cancel")
    assert getattr(canceled, "objectiveId", None) == objective_id


async def test_a_posted_callback_is_a_debug_line_and_a_failed_one_a_warning(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    # A posted callback was INFO: with one callback URL a job that ran once wrote four INFO
    # lines (its `dispatched` and terminal posts beside `api.enqueued` and `attempt.settled`),
    # where the README's RECEIPT_LOG_LEVEL says two.
    from activities.driver import post_callbacks
    from receipts.settings import Settings
    from tests.integration.delivery.receiver import Receiver

    caplog.set_level(logging.DEBUG, logger="activities.driver")
    job = (await put(store, org="org-a")).job
    async with Receiver() as receiver, httpx.AsyncClient() as http:
        settings = Settings(RECEIPT_EVENT_CALLBACK_URL=receiver.url)
        assert await post_callbacks(store, settings, http, job, "dispatched") == 1
        refused = Settings(RECEIPT_EVENT_CALLBACK_URL="http://127.0.0.1:9/none")
        assert await post_callbacks(store, refused, http, job, "completed") == 0
    levels = {r.event: r.levelno for r in caplog.records if hasattr(r, "event")}
    assert levels == {"callback.posted": logging.DEBUG, "callback.failed": logging.WARNING}
