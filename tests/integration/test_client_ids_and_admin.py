"""receipt-client against a real `receipt api` process: ids the API takes that are dot segments
(`.`, `..`) reach their own job and schedule, and an admin token creates an organization's
webhook (the README: "an admin token names `organizationId`")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from receipt_client import AsyncClient, Client, models
from tests.integration.api_support import (
    TOKEN_A,
    TOKEN_ADMIN,
    RunningApi,
    receipt_cli,
    running_api,
)
from tests.integration.test_client import task


@pytest.fixture(scope="module")
def api(db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    with running_api(
        db_url, Path(tmp_path_factory.mktemp("api")), RECEIPT_WEBHOOK_ALLOWED_HOSTS="127.0.0.1"
    ) as api:
        yield api


@pytest.mark.parametrize("job_id", ["..", "."])
def test_a_job_whose_id_is_a_dot_segment_is_read_commanded_and_waited_for(
    api: RunningApi, job_id: str
) -> None:
    """`..` and `.` match the API's job id pattern and are enqueued (the id is in the body), but
    httpx resolved `/jobs/..` to `/` and `/jobs/.` to `/jobs`: `get_job('..')` was a 404 and
    `get_job('.')` read the job list into a `JobView` (a validation error)."""
    with Client(api.url, TOKEN_A) as client:
        assert client.enqueue("codex", task(), job_id=job_id).job.job_id == job_id
        assert client.get_job(job_id).job_id == job_id
        client.abort(job_id, reason="a dot")
        done = client.wait(job_id, timeout=30)
        assert (done.job_id, done.status) == (job_id, "canceled")
        assert [r.type for r in client.receipts(job_id)][-1] == "job.canceled"


def test_the_cli_reaches_a_job_and_a_schedule_whose_id_is_a_dot_segment(api: RunningApi) -> None:
    """`receipt jobs get ..` built `/jobs/..` itself, which httpx resolved to `/`."""
    with Client(api.url, TOKEN_A) as client:
        client.enqueue("codex", task(), job_id="..")
        client.create_schedule(
            {"scheduleId": ".", "interval": "1h", "agentId": "codex", "job": {"payload": task()}}
        )
    shown = receipt_cli(api, TOKEN_A, "jobs", "get", "..")
    assert shown.returncode == 0, shown.stderr
    assert ".." in shown.stdout.split("\n")[0], shown.stdout
    gone = receipt_cli(api, TOKEN_A, "schedules", "delete", ".")
    assert gone.returncode == 0, gone.stderr
    with Client(api.url, TOKEN_A) as client:
        assert "." not in [s.schedule_id for s in client.list_schedules(limit=200).schedules]


def test_a_schedule_whose_id_is_a_dot_segment_is_read_and_deleted(api: RunningApi) -> None:
    with Client(api.url, TOKEN_A) as client:
        body = {
            "scheduleId": "..",
            "interval": "1h",
            "agentId": "codex",
            "job": {"payload": task()},
        }
        assert client.create_schedule(body).schedule_id == ".."
        assert client.get_schedule("..").schedule_id == ".."
        assert client.pause_schedule("..").status == "paused"
        client.delete_schedule("..")
        assert ".." not in [s.schedule_id for s in client.list_schedules(limit=200).schedules]


async def test_an_admin_token_creates_an_organization_s_webhook(api: RunningApi) -> None:
    """An admin token must name the organization of a webhook; `create_webhook` could not send
    `organizationId`, so every admin call was a 422."""
    with Client(api.url, TOKEN_ADMIN) as admin:
        created = admin.create_webhook(
            "http://127.0.0.1:9/hook", ["job.failed"], organization_id="org-a"
        )
    assert isinstance(created, models.WebhookCreated)
    assert created.webhook.organization_id == "org-a"
    with Client(api.url, TOKEN_A) as client:
        assert created.webhook.webhook_id in [w.webhook_id for w in client.list_webhooks().webhooks]
    async with AsyncClient(api.url, TOKEN_ADMIN) as admin_async:
        again = await admin_async.create_webhook(
            "http://127.0.0.1:9/other", ["job.failed"], organization_id="org-a"
        )
    assert again.webhook.organization_id == "org-a"


def test_an_admin_reaches_the_console_s_agent_job_routes(api: RunningApi) -> None:
    """`GET /console/agent-jobs`, `GET /console/agent-jobs/{id}` and `POST …/cancel` (admin
    tokens, in the published document) had no method: only untyped `request` reached them."""
    from tests.integration.test_api_agent_jobs import body as agent_job_body

    body = agent_job_body()
    with Client(api.url, TOKEN_A) as client:
        agent_job_id = client.create_agent_job(body).agent_job.agent_job_id
    with Client(api.url, TOKEN_ADMIN) as admin:
        listed = admin.console_agent_jobs(organization_id="org-a", limit=500)
        assert agent_job_id in [j.agent_job_id for j in listed.agent_jobs]
        detail = admin.console_agent_job(agent_job_id)
        assert isinstance(detail, models.AgentJobDetail)
        assert [r.type for r in detail.receipts] == ["agent_job.created"]
        stopped = admin.console_cancel_agent_job(agent_job_id, reason="operator")
        assert stopped.agent_job.status == "stopped"
