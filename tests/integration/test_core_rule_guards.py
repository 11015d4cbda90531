"""Core job rules no test held until a mutation audit broke their lines one at a time: each
test here fails with its line broken (named in the test) and passes as the code is."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from activities.fence import AttemptFence
from activities.handlers.context import HandlerContext, HandlerError
from activities.settle import SHUTDOWN_ERROR, Settlement
from receipts import delivery_ids
from receipts import operations as ops
from receipts.enqueue import Admission, enqueue, parse_enqueue
from receipts.errors import InvalidInput
from receipts.jobs import SINGLETON_CANCEL_REASON
from receipts.messages import AttemptStatus
from receipts.store import Store
from tests.integration.helpers import body, new_id, put, types
from tests.integration.test_attempt_activity import RUN, attempt_of, job_of, run

LEASE = 60_000


def _made_up(**fields: Any) -> Any:
    """An id-less post as the API makes it: a made-up id, no lookup (`new_job_id`)."""
    request = parse_enqueue("codex", body(**fields))
    return dataclasses.replace(request, job_id=new_id(), new_job_id=True)


async def test_an_id_less_post_with_a_session_key_still_applies_its_singleton_mode(
    store: Store,
) -> None:
    """J11/J12 for the API's id-less posts (`new_job_id`): only a post without a session key
    may take the no-transaction path; one with a session key is cancelled or steered like any
    other (broken by dropping `request.session_key is None` from `enqueue`'s fast path)."""
    session = new_id("session")
    first = await enqueue(store, _made_up(sessionKey=session))
    second = await enqueue(store, _made_up(sessionKey=session, singletonMode="cancel"))
    assert second.created and [j.job_id for j in second.affected] == [first.job.job_id]
    canceled = await store.get_job(first.job.job_id)
    assert canceled is not None and canceled.status == "canceled"
    assert canceled.canceled_reason == SINGLETON_CANCEL_REASON
    steer = await enqueue(store, _made_up(sessionKey=session, singletonMode="steer"))
    assert steer.outcome == "steered" and steer.job.job_id == second.job.job_id
    assert await store.get_job(steer.job.job_id) == steer.job


async def test_a_new_job_whose_caps_filled_before_its_statement_is_refused_not_reported(
    store: Store,
) -> None:
    """The caps `enqueue_new` read let the job in, but the organization filled up before its
    statement ran (the statement's own check writes nothing): it must read again and refuse,
    never answer `created` for a job it did not write (broken by trusting the statement
    without looking at what it wrote)."""
    checks: list[tuple[int, int]] = []

    def refuse(queued: int, active: int) -> None:
        checks.append((queued, active))
        if len(checks) > 1:  # the second read sees the organization full
            raise InvalidInput("jobs", "the organization is at its cap")

    org = new_id("org")
    admission = Admission(organization_id=org, max_queued=0, max_active=0, refuse=refuse)
    request = _made_up(org=org)
    with pytest.raises(InvalidInput):
        await enqueue(store, request, admission)
    assert len(checks) == 2
    assert await store.get_job(request.job_id) is None
    assert await types(store, request.job_id) == []


async def test_an_abort_without_a_reason_cancels_a_queued_job_saying_so(store: Store) -> None:
    """An abort of a queued job cancels it at once; with no reason given the job says
    `abort requested` (broken by dropping that default: the reason was null)."""
    job = (await put(store)).job
    sent = await ops.add_command(store, job.job_id, type="abort", organization_id="org-a")
    assert sent.ok
    canceled = await store.get_job(job.job_id)
    assert canceled is not None and canceled.status == "canceled"
    assert canceled.canceled_reason == "abort requested"


async def test_an_abort_that_lands_as_the_handler_returns_wins_over_its_result(
    store: Store,
) -> None:
    """J34: the worker re-reads before it settles, and an abort found there wins over the
    handler's result: canceled, not completed (broken by dropping the re-read's abort check)."""
    job = (await put(store)).job
    fence = AttemptFence(store, job.job_id, attempt=1, worker_id=f"{job.job_id}:attempt:1/1")
    assert (await fence.start(LEASE, {"role": "test"})).ok

    async def finished() -> dict[str, int]:
        return {"answer": 42}

    handler = asyncio.create_task(finished())
    await asyncio.wait({handler})
    sent = await ops.add_command(
        store, job.job_id, type="abort", reason="too late", organization_id="org-a"
    )
    assert sent.ok
    result = await Settlement(fence).handler_done(handler, 0.1)
    assert (result.status, result.job_status) == ("canceled", "canceled")
    settled = await store.get_job(job.job_id)
    assert settled is not None and settled.status == "canceled"
    assert settled.canceled_reason == "too late" and settled.result is None


async def test_a_redelivery_of_an_aborted_job_cancels_it_without_running_the_handler(
    store: Store,
) -> None:
    """J34's first step: a delivery checks `abortRequested` before it runs anything. The first
    delivery leased the job and died; an abort arrived; the redelivery takes the lease over
    and settles `canceled` without calling the handler (broken by dropping that check: the
    handler ran, with its side effects, before the abort was noticed)."""
    calls: list[str] = []

    async def handler(ctx: HandlerContext) -> None:
        calls.append(ctx.worker_id)

    job_id = await job_of(store, "act-aborted")
    first = AttemptFence(
        store, job_id, attempt=1, worker_id=delivery_ids.delivery_id(job_id, 1, RUN, 1)
    )
    assert (await first.start(LEASE, {"role": "test"})).ok
    sent = await ops.add_command(
        store, job_id, type="abort", reason="stop it", organization_id="org-a"
    )
    assert sent.ok
    result = await run(store, {"act-aborted": handler}, attempt_of(job_id, "act-aborted"), 2)
    assert (result.status, result.job_status) == (AttemptStatus.CANCELED, "canceled")
    assert calls == []


async def test_a_handler_that_raises_cancelled_error_itself_is_retried(store: Store) -> None:
    """A handler whose own code ends in CancelledError (nobody cancelled it) is a handler
    failure, retried while attempts remain (broken by settling it non-retryably)."""

    async def handler(ctx: HandlerContext) -> None:
        raise asyncio.CancelledError

    job_id = await job_of(store, "act-cancelled")
    result = await run(store, {"act-cancelled": handler}, attempt_of(job_id, "act-cancelled"))
    assert (result.status, result.job_status) == (AttemptStatus.FAILED, "queued")
    job = await store.get_job(job_id)
    assert job is not None and job.status == "queued" and job.attempt == 1
    assert job.error is not None and job.error.startswith("CancelledError")


async def test_a_release_at_shutdown_gives_the_job_back_without_costing_an_attempt(
    store: Store,
) -> None:
    """X19: a worker shutting down releases its job: queued again, its attempt refunded, so
    even the last attempt is tried again (broken by releasing without the refund: the last
    attempt's job failed for good)."""
    job = (await put(store, maxAttempts=1)).job
    fence = AttemptFence(store, job.job_id, attempt=1, worker_id=f"{job.job_id}:attempt:1/1")
    assert (await fence.start(LEASE, {"role": "test"})).ok
    await Settlement(fence).release()
    released = await store.get_job(job.job_id)
    assert released is not None and released.status == "queued"
    assert released.attempt == 0 and released.error == SHUTDOWN_ERROR


async def test_a_retryable_failure_keeps_its_status_out_of_the_receipt(store: Store) -> None:
    """J39: a retryable failure's `job.failed` records the error and requeues; its status stays
    in the worker's return only, while a terminal one carries it (broken by passing the status
    on a retryable failure too: the receipt named it)."""

    async def handler(ctx: HandlerContext) -> None:
        raise HandlerError("boom", retryable=ctx.attempt < 2)

    job_id = await job_of(store, "act-status")
    handlers = {"act-status": handler}
    first = await run(store, handlers, attempt_of(job_id, "act-status"))
    last = await run(store, handlers, attempt_of(job_id, "act-status", attempt=2))
    assert (first.status, first.job_status) == (AttemptStatus.FAILED, "queued")
    assert (last.status, last.job_status) == (AttemptStatus.FAILED, "failed")
    failed = [r.data for r in await store.read_stream(f"jobs/{job_id}") if r.type == "job.failed"]
    assert [d.get("retryable") for d in failed] == [True, False]
    assert "status" not in failed[0] and failed[1]["status"] == "failed"
