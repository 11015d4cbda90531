"""Per-organization webhooks through real role processes: the driver role's deliverer posts a
job's terminal event to its organization's receiver, signed, again after a 500, and nothing of
it to another organization's."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import pytest
from standardwebhooks.webhooks import Webhook as Verifier

from receipts import webhooks as hooks
from receipts.store import Store
from receipts.tenancy import caller_id
from tests.e2e.roles_harness import RoleProcesses, wait_for
from tests.eventually import eventually
from tests.integration.helpers import put
from tests.integration.test_webhooks import Receiver

pytestmark = pytest.mark.e2e


async def test_the_driver_delivers_a_jobs_event_to_its_organization_only(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses]
) -> None:
    store, _ = e2e_store
    receiver = Receiver(statuses={"/a": [500]})
    server = await asyncio.start_server(receiver.handle, "127.0.0.1", 0)
    receiver.port = server.sockets[0].getsockname()[1]
    settings = {"url": receiver.url("/a"), "events": ["job.failed"], "description": None}
    a, secret_a, _ = await hooks.create(
        store, "org-a", hooks.parse_create(settings), max_per_organization=20
    )
    other = {"url": receiver.url("/b"), "events": ["job.failed", "job.completed"]}
    await hooks.create(store, "org-b", hooks.parse_create(other), max_per_organization=20)
    procs = roles(
        RECEIPT_LOG_FORMAT="json",
        RECEIPT_WEBHOOK_ALLOWED_HOSTS="127.0.0.1",
        RECEIPT_WEBHOOK_POLL_INTERVAL_MS="100",
        RECEIPT_WEBHOOK_RETRY_BASE_MS="300",
        RECEIPT_WEBHOOK_RETRY_MAX_MS="600",
    )
    procs.start("driver")
    procs.start("worker-chat")
    try:
        # No handler for this agent: the job fails for good, a terminal `job.failed`.
        job = (await put(store, agent="nobody-handles-this", org="org-a", maxAttempts=1)).job
        assert (await wait_for(store, job.job_id, ("failed",), 90)).status == "failed"
        deadline = time.monotonic() + 30
        while len(receiver.at("/a")) < 2:
            assert time.monotonic() < deadline, f"posts so far: {receiver.posts}"
            await asyncio.sleep(0.1)
    except BaseException:
        print(procs.logs())
        raise
    finally:
        server.close()
        await server.wait_closed()
    first, second = receiver.at("/a")
    assert first.headers["webhook-id"] == second.headers["webhook-id"]  # one delivery, retried
    body = Verifier(secret_a).verify(second.body, second.headers)
    assert body["type"] == "job.failed"
    assert body["data"]["job"]["jobId"] == caller_id(job.job_id)
    assert "No handler" in json.dumps(body["data"]["job"])
    assert receiver.at("/b") == []  # organization B's receiver heard nothing of A's job
    # The deliverer records a try after its answer arrived: the receiver may see the second
    # post before the row says so.
    items, _ = await eventually(
        lambda: hooks.deliveries_page(store, a.webhook_id, None, 10),
        lambda page: bool(page[0]) and page[0][0]["status"] != "pending",
        timeout=30,
        every=0.1,
        what="the delivery row recording its last try",
    )
    assert [(d["status"], d["tries"], d["attempts"][0]["statusCode"]) for d in items] == [
        ("delivered", 2, 500)
    ]
    procs.stop_all()
    logged = procs.logged("driver", {"webhook.retried", "webhook.delivered"})
    assert [r["event"] for r in logged] == ["webhook.retried", "webhook.delivered"]
