"""Forced interleavings of per-organization webhooks against real PostgreSQL: a second
connection holds a row (an uncommitted delete, rotate) while the other side goes on."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import psycopg
import pytest
from standardwebhooks.webhooks import WebhookVerificationError

from receipts import assembly, metrics, webhook_tries
from receipts import operations as ops
from receipts import webhooks as hooks
from receipts.errors import ConflictError
from receipts.store import Store
from receipts.webhooks import WebhookCreate
from roles.delivery.webhooks import WebhookDeliverer
from tests.integration.helpers import put
from tests.integration.test_webhooks import ALLOWED, Receiver, http, receiver, verify
from tests.lost_answer import LostAnswerProxy

__all__ = ["http", "receiver"]  # the receiver and client fixtures of test_webhooks.py

LEASE = 60_000


async def _running(store: Store, org: str = "org-a") -> str:
    job = (await put(store, org=org, maxAttempts=1)).job
    out = await ops.start_attempt(store, job.job_id, attempt=1, worker_id="w1", lease_ms=LEASE)
    assert out.ok
    return job.job_id


async def _hook(store: Store, org: str = "org-a", events: list[str] | None = None) -> str:
    created, _, _ = await hooks.create(
        store,
        org,
        WebhookCreate("http://127.0.0.1:9/r", events or ["job.completed"], None),
        max_per_organization=20,
    )
    return created.webhook_id


async def _blocked_pids(conninfo: str, blocker: int) -> list[int]:
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as watch:
        cur = await watch.execute(
            "SELECT pid FROM pg_stat_activity WHERE %s = ANY (pg_blocking_pids(pid))", (blocker,)
        )
        return [r[0] for r in await cur.fetchall()]


async def _until_blocked_by(conninfo: str, blocker: int) -> None:
    for _ in range(500):
        if await _blocked_pids(conninfo, blocker):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("nothing waited on the holder")


async def _owe(store: Store, way: str, job_id: str, hook: str) -> None:
    """Owe `hook`'s organization an event the way `way` names (each one's own statement)."""
    if way == "guarded":  # the worker's settle: the one guarded statement
        out = await ops.complete(store, job_id, worker_id="w1", attempt=1, result={"ok": 1})
        assert out.ok, out
    elif way == "locked":  # a settle in the row-locked transaction (append_job)
        out = await ops.cancel_queued(store, job_id, reason="no")
        assert out.ok, out
    elif way == "event":  # a wakeup's or an objective's, in the caller's transaction
        async with store.transaction() as tx:
            await hooks.owe(
                tx, "org-a", hooks.WAKEUP_EVENT, event_key="w1", subject=job_id, data={"a": 1}
            )
    else:  # a test post: the subscription is gone, which the route answers
        webhook = await hooks.get(store, hook)
        assert webhook is not None
        with pytest.raises(ConflictError, match="was deleted"):
            await hooks.send_test(store, webhook)


@pytest.mark.parametrize("way", ["guarded", "locked", "event", "test"])
async def test_a_webhook_deleted_while_an_event_is_owed_to_it_fails_nothing(
    fresh: tuple[Store, str], way: str
) -> None:
    """The delete has locked the subscription when the writer reads it (still there in the
    writer's snapshot) and commits while the writer waits: the writer owes it nothing, and
    what it writes (a job's settle) is not refused by the delivery's foreign key."""
    store, url = fresh
    hook = await _hook(store, events=["job.completed", "job.canceled", hooks.WAKEUP_EVENT])
    job_id = (
        await _running(store) if way == "guarded" else (await put(store, org="org-a")).job.job_id
    )
    async with await psycopg.AsyncConnection.connect(url) as deleter:
        await deleter.execute("DELETE FROM webhooks WHERE webhook_id = %s", (hook,))
        owing = asyncio.create_task(_owe(store, way, job_id, hook))
        await _until_blocked_by(url, deleter.info.backend_pid)
        await deleter.commit()
        await owing
    if way in ("guarded", "locked"):
        job = await store.get_job(job_id)
        assert job is not None and job.terminal
    async with store.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM webhook_deliveries")
        row: Any = await cur.fetchone()
    assert row[0] == 0  # nothing owed to a subscription that is gone


async def _claimed_test_post(store: Store, receiver: Receiver) -> tuple[str, str, hooks.Claimed]:
    """A subscription of org-a at the receiver, and its test post claimed by a deliverer that
    has not posted it yet (its event read, its host looked up: the window this leaves)."""
    created, secret, _ = await hooks.create(
        store,
        "org-a",
        WebhookCreate(receiver.url("/r"), ["job.completed"], None),
        max_per_organization=20,
    )
    webhook = await hooks.get(store, created.webhook_id)
    assert webhook is not None
    await hooks.send_test(store, webhook)
    [claimed] = await hooks.claim(store, limit=10, per_org=4, lease_ms=25_000)
    return created.webhook_id, secret, claimed


async def test_a_secret_rotated_while_a_delivery_is_claimed_signs_its_post(
    fresh: tuple[Store, str], receiver: Receiver, http: httpx.AsyncClient
) -> None:
    """README: after a rotation 'every later post, retries included, is signed with it and the
    old one verifies none'. The secret was read with the claim, so a post made after the
    rotation answered was signed with the old one (and the receiver refused it)."""
    store, _ = fresh
    hook, old, claimed = await _claimed_test_post(store, receiver)
    rotated = await hooks.rotate_secret(store, hook)
    assert rotated is not None
    _, new = rotated
    assert await WebhookDeliverer(store, ALLOWED, http)._try(claimed) == "delivered"
    [post] = receiver.at("/r")
    assert verify(post, new)["type"] == "webhook.test"
    with pytest.raises(WebhookVerificationError):
        verify(post, old)


async def test_a_webhook_deleted_while_its_delivery_is_claimed_is_not_posted_to(
    fresh: tuple[Store, str],
    receiver: Receiver,
    http: httpx.AsyncClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """README: `DELETE /webhooks/{id}` (204: the deliveries it still owes go with it). One a
    deliverer had claimed was posted after the delete answered (and logged as a try that
    outlived its claim). It is not posted: counted and logged `dropped`."""
    store, _ = fresh
    hook, _, claimed = await _claimed_test_post(store, receiver)
    assert await hooks.delete(store, hook)
    dropped = metrics.WEBHOOK_DELIVERIES.labels(hooks.TEST_EVENT, "dropped")
    before = dropped._value.get()
    caplog.set_level("INFO", logger="roles.delivery.webhooks")
    assert await WebhookDeliverer(store, ALLOWED, http)._try(claimed) == "dropped"
    assert receiver.posts == []
    assert dropped._value.get() - before == 1
    assert [r.__dict__["event"] for r in caplog.records] == ["webhook.dropped"]


@pytest.mark.parametrize(("status", "outcome"), [(200, "delivered"), (500, "retried")])
async def test_a_try_whose_record_lost_its_answer_is_counted_as_recorded(
    fresh: tuple[Store, str],
    receiver: Receiver,
    http: httpx.AsyncClient,
    caplog: pytest.LogCaptureFixture,
    status: int,
    outcome: str,
) -> None:
    """The record of a try committed and its answer was lost (tests/lost_answer.py): the try was
    counted `lapsed` and logged 'its claim lapses and it is tried again', though its record
    stood (the delivery delivered, or pending its next try) and nothing was tried again until
    then. Read back, it is counted and logged as what it recorded; posted once."""
    store, url = fresh
    proxy = await LostAnswerProxy(url).start()
    cut = await assembly.open_store(proxy.url(), min_size=1, max_size=4)
    try:
        _, _, claimed = await _claimed_test_post(store, receiver)
        receiver.statuses["/r"] = [status]
        counted = {
            label: metrics.WEBHOOK_DELIVERIES.labels(hooks.TEST_EVENT, label)
            for label in ("lapsed", outcome)
        }
        before = {label: c._value.get() for label, c in counted.items()}
        caplog.set_level("INFO", logger="roles.delivery.webhooks")
        proxy.arm("tries = tries + 1")  # the try's record (webhook_delivery_record)
        assert await WebhookDeliverer(cut, ALLOWED, http)._try(claimed) == outcome
        assert proxy.cut.is_set(), proxy.lost
    finally:
        await cut.close()
        await proxy.close()
    assert {label: c._value.get() - before[label] for label, c in counted.items()} == {
        "lapsed": 0,
        outcome: 1,
    }
    ours = [r for r in caplog.records if r.name == "roles.delivery.webhooks"]
    assert [r.__dict__["event"] for r in ours] == [f"webhook.{outcome}"]
    row = await store.fetch_one("webhook_delivery_tried", {"delivery_id": claimed.delivery_id})
    assert row is not None and row[0] == ("delivered" if status == 200 else "pending")
    assert len(receiver.at("/r")) == 1


@pytest.mark.parametrize("outcome", ["delivered", "pending"])
async def test_a_lapsed_try_whose_record_lost_its_answer_is_superseded_not_recorded(
    fresh: tuple[Store, str], receiver: Receiver, outcome: str
) -> None:
    """A try that outlived its claim (a stalled deliverer) records nothing over the deliverer
    that took the delivery, and says so (None: `superseded`). Its record's answer lost, it reads
    back a delivery that moved on after its claim's end: that record may be the other's, so it
    is not taken as this try's, as when the answer comes."""
    store, url = fresh
    created, _, _ = await hooks.create(
        store,
        "org-a",
        WebhookCreate(receiver.url("/r"), ["job.completed"], None),
        max_per_organization=20,
    )
    webhook = await hooks.get(store, created.webhook_id)
    assert webhook is not None
    await hooks.send_test(store, webhook)
    [stalled] = await hooks.claim(store, limit=10, per_org=4, lease_ms=50)
    await asyncio.sleep(0.2)  # its claim lapses; another deliverer takes the delivery
    [taker] = await hooks.claim(store, limit=10, per_org=4, lease_ms=25_000)
    assert taker.delivery_id == stalled.delivery_id
    record: dict[str, Any] = {
        "status_code": 200,
        "error": None,
        "duration_ms": 3,
        "retry_ms": 60_000,
    }
    assert await webhook_tries.record_try(store, taker, status=outcome, **record) is not None
    proxy = await LostAnswerProxy(url).start()
    cut = await assembly.open_store(proxy.url(), min_size=1, max_size=2)
    try:
        proxy.arm("tries = tries + 1")  # the stalled try's record (webhook_delivery_record)
        late = await webhook_tries.record_try(cut, stalled, status="delivered", **record)
        assert proxy.cut.is_set(), proxy.lost
    finally:
        await cut.close()
        await proxy.close()
    assert late is None
    row = await store.fetch_one("webhook_delivery_tried", {"delivery_id": stalled.delivery_id})
    assert row is not None and row[0] == outcome
