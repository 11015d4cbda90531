"""Enqueue against real PostgreSQL: idempotency, singleton modes, session scoping, bad input."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest

from receipts import commands
from receipts import operations as ops
from receipts.enqueue import enqueue, parse_enqueue
from receipts.errors import ConflictError, InvalidInput
from receipts.kinds import KINDS
from receipts.store import Store
from tests.integration.helpers import body, new_id, put, types


async def test_enqueue_appends_one_job_enqueued(store: Store) -> None:
    result = await put(store, lane="chat", maxAttempts=3)
    job = result.job
    assert result.outcome == "created"
    assert (job.status, job.lane, job.max_attempts, job.attempt) == ("queued", "chat", 3, 0)
    assert job.organization_id == "org-a"
    assert await types(store, job.job_id) == ["job.enqueued"]
    assert await store.get_job(job.job_id) == job


async def test_defaults_lane_collect_allow_two_attempts(store: Store) -> None:
    job = (await put(store)).job
    assert (job.lane, job.singleton_mode, job.max_attempts) == ("collect", "allow", 2)


@pytest.mark.parametrize(("given", "stored"), [(0, 1), (-3, 1), (1, 1), (8, 8), (9, 8), (100, 8)])
async def test_max_attempts_is_clamped_to_one_through_eight(
    store: Store, given: int, stored: int
) -> None:
    assert (await put(store, maxAttempts=given)).job.max_attempts == stored


async def test_same_job_id_returns_the_existing_job_unchanged(store: Store) -> None:
    job_id = new_id()
    first = await put(store, jobId=job_id, lane="chat")
    again = await put(store, jobId=job_id, lane="steer", maxAttempts=5)
    assert again.outcome == "existing"
    assert again.job == first.job
    assert await types(store, job_id) == ["job.enqueued"]


async def test_job_id_of_another_organization_conflicts_and_writes_nothing(store: Store) -> None:
    job_id = new_id()
    await put(store, jobId=job_id, org="org-a")
    with pytest.raises(ConflictError):
        await put(store, jobId=job_id, org="org-b")
    assert await types(store, job_id) == ["job.enqueued"]


async def test_singleton_cancel_cancels_queued_and_aborts_running(store: Store) -> None:
    session = new_id("session")
    queued = (await put(store, sessionKey=session)).job
    running = (await put(store, sessionKey=session)).job
    leased = await ops.lease(store, running.job_id, attempt=1, worker_id="w", lease_ms=60_000)
    assert leased.ok
    result = await put(store, sessionKey=session, singletonMode="cancel")
    assert result.created
    canceled = await store.get_job(queued.job_id)
    aborted = await store.get_job(running.job_id)
    assert canceled is not None and aborted is not None
    assert (canceled.status, canceled.canceled_reason) == ("canceled", "singleton cancel")
    assert aborted.status == "leased" and aborted.abort_requested
    assert aborted.abort_reason == "singleton cancel"
    assert aborted.commands[-1].type == "abort"
    assert await types(store, running.job_id) == ["job.enqueued", "job.leased", "queue.command"]
    assert {j.job_id for j in result.affected} == {queued.job_id, running.job_id}


async def test_singleton_steer_returns_the_most_recent_active_job(store: Store) -> None:
    session = new_id("session")
    await put(store, sessionKey=session)
    newest = (await put(store, sessionKey=session)).job
    steer_id = new_id("steer")
    result = await put(
        store,
        sessionKey=session,
        singletonMode="steer",
        jobId=steer_id,
        payload_extra={"prompt": "also do this"},
    )
    assert result.outcome == "steered"
    assert result.job.job_id == newest.job_id
    command = result.job.commands[-1]
    assert (command.command_id, command.type, command.lane) == (steer_id, "steer", "steer")
    assert command.from_session_key == session and command.from_enqueue is True
    [read] = await commands.with_payloads(store, newest.job_id, [command])
    assert read.payload["prompt"] == "also do this"
    assert await store.get_job(steer_id) is None
    # A retried steer-enqueue with the same jobId adds nothing and returns the steered job.
    again = await put(
        store,
        sessionKey=session,
        singletonMode="steer",
        jobId=steer_id,
        payload_extra={"prompt": "also do this"},
    )
    assert again.outcome == "steered" and again.job.job_id == newest.job_id
    assert not again.idempotency_mismatch
    # The steer's payload is read from its receipt to tell a retry from another request: the
    # steered job is returned unchanged all the same, flagged.
    other = await put(
        store,
        sessionKey=session,
        singletonMode="steer",
        jobId=steer_id,
        payload_extra={"prompt": "something else"},
    )
    assert other.outcome == "steered" and other.idempotency_mismatch
    assert other.job == again.job
    assert await types(store, newest.job_id) == ["job.enqueued", "queue.command"]


async def test_singleton_steer_without_an_active_job_creates_one(store: Store) -> None:
    session = new_id("session")
    result = await put(store, sessionKey=session, singletonMode="steer")
    assert result.created and result.job.session_key == session


async def test_lease_expiry_is_evaluated_before_the_session_scan(store: Store) -> None:
    session = new_id("session")
    dead = (await put(store, sessionKey=session, maxAttempts=1)).job
    assert (await ops.lease(store, dead.job_id, attempt=1, worker_id="w", lease_ms=1)).ok
    # The worker died: its lease passes by the database clock, so the steer must not land on it.
    await _wait_past_expiry(store, dead.job_id)
    result = await put(store, sessionKey=session, singletonMode="steer")
    assert result.created
    expired = await store.get_job(dead.job_id)
    assert expired is not None and expired.status == "failed"
    assert expired.error == "lease expired after 1 attempts"
    assert await types(store, dead.job_id) == ["job.enqueued", "job.leased", "job.lease_expired"]


async def _wait_past_expiry(store: Store, job_id: str) -> None:
    job = await store.get_job(job_id)
    assert job is not None and job.lease is not None
    while await store.now() <= job.lease.expires_at + timedelta(milliseconds=1):
        pass


async def test_session_keys_are_scoped_by_organization(store: Store) -> None:
    session = new_id("session")
    a = (await put(store, sessionKey=session, org="org-a")).job
    b = await put(store, sessionKey=session, org="org-b", singletonMode="cancel")
    steer = await put(store, sessionKey=session, org="org-b", singletonMode="steer")
    assert b.created and not b.affected
    assert steer.outcome == "steered" and steer.job.job_id == b.job.job_id
    untouched = await store.get_job(a.job_id)
    assert untouched == a


async def test_delay_sets_available_at_from_the_database_clock(store: Store) -> None:
    before = await store.now()
    job = (await put(store, delayMs=60_000)).job
    assert job.available_at is not None
    assert job.available_at - before >= timedelta(milliseconds=60_000)
    leased = await ops.lease(store, job.job_id, attempt=1, worker_id="w", lease_ms=1000)
    assert leased.status == "not_available"


BAD: list[tuple[str, dict[str, Any], str]] = [
    (
        "unknown kind",
        {"payload": {"kind": "nope", "authContext": {"userId": "u", "organizationId": "o"}}},
        "payload.kind",
    ),
    ("no authContext", {"payload": {"kind": "factory.run"}}, "payload.authContext"),
    (
        "no userId",
        {"payload": {"kind": "factory.run", "authContext": {"organizationId": "o"}}},
        "payload.authContext.userId",
    ),
    (
        "empty organizationId",
        {"payload": {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": ""}}},
        "payload.authContext.organizationId",
    ),
    ("unknown lane", body(lane="urgent"), "lane"),
    ("unknown singleton mode", body(singletonMode="replace"), "singletonMode"),
    ("maxAttempts two", body(maxAttempts="two"), "maxAttempts"),
    ("NUL in payload", body(payload_extra={"prompt": "a\u0000b"}), "payload.prompt"),
    ("lone surrogate", body(payload_extra={"prompt": "\ud800"}), "payload.prompt"),
]


@pytest.mark.parametrize(("case", "request_body", "field"), BAD, ids=[b[0] for b in BAD])
async def test_bad_input_is_rejected_and_nothing_is_written(
    store: Store, case: str, request_body: dict[str, Any], field: str
) -> None:
    job_id = new_id()
    before = await store.read_all(after_position=0, limit=1_000_000)
    with pytest.raises(InvalidInput) as error:
        await enqueue(store, parse_enqueue("codex", {**request_body, "jobId": job_id}))
    assert error.value.field == field
    assert await store.read_stream(f"jobs/{job_id}") == []
    assert await store.read_all(after_position=0, limit=1_000_000) == before


def test_unknown_kind_error_names_all_nine_kinds() -> None:
    with pytest.raises(InvalidInput) as error:
        parse_enqueue("codex", {"payload": {"kind": "x"}})
    assert error.value.allowed == list(KINDS) and len(KINDS) == 9
    for kind in KINDS:
        assert kind in error.value.message


def test_unknown_lane_error_names_the_four_lanes() -> None:
    with pytest.raises(InvalidInput) as error:
        parse_enqueue("codex", body(lane="bulk"))
    assert error.value.allowed == ["chat", "collect", "steer", "follow_up"]


async def test_watchdog_kind_needs_no_auth_context(store: Store) -> None:
    job = (
        await enqueue(
            store,
            parse_enqueue("factory-control", {"payload": {"kind": "factory.objective.watchdog"}}),
        )
    ).job
    assert job.organization_id is None and job.status == "queued"


async def test_unknown_agent_id_is_accepted(store: Store) -> None:
    job = (await put(store, agent="nobody-home")).job
    assert job.agent_id == "nobody-home" and job.status == "queued"


async def test_a_made_up_id_skips_the_lookup_and_the_unique_key_still_guards(
    store: Store,
) -> None:
    """The API makes up a random id for an id-less post (`new_job_id`): no lookup runs, so a
    made-up id that named an existing job (it cannot, short of a uuid collision) would not
    answer that job as `existing`; the chain's unique key refuses the write instead."""
    request = parse_enqueue("codex", body())
    made_up = dataclasses.replace(request, job_id=new_id(), new_job_id=True)
    first = await enqueue(store, made_up)
    assert first.outcome == "created" and first.job.job_id == made_up.job_id
    with pytest.raises(ConflictError):
        await enqueue(store, made_up)
    assert await types(store, first.job.job_id) == ["job.enqueued"]
    # Named by the caller, the same id is the idempotent re-post.
    again = await enqueue(store, dataclasses.replace(made_up, new_job_id=False))
    assert again.outcome == "existing" and again.job == first.job
