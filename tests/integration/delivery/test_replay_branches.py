"""Live drivers through the branches of `_Driver._drive` that a plain delivery never takes — a
live lease waited out (ACTIVE), a retry delay waited out (NOT_AVAILABLE), a dead delivery's
lease ended (STALE_FAILED, requeued or settled), an abort honoured at the driver's read
(ABORTED), a job found settled by a continued-as-new run (TERMINAL) — each run asserted from
its history and replayed under the sandbox. `RECEIPT_RECORD_HISTORIES=<dir>` writes them as
`jobdriver-<branch>-<run>.json` (tests/integration/delivery/histories/, replayed by
test_replay.py's `test_histories_recorded_by_this_and_earlier_versions_still_replay`).

A delivery that died holding its lease (a worker killed mid-attempt) is the lease taken with
the receipts' own `lease` operation under a worker id nothing renews; its driver is started by
the starter, as the redrive starts the next generation of a job with no open driver."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHistory
from temporalio.service import RPCError, RPCStatusCode

from activities.driver import STALE_ERROR
from activities.handlers.context import HandlerContext, HandlerError
from receipts import operations as ops
from receipts.deliveries import driver_workflow_id
from receipts.kinds import QUEUE_CODEX
from receipts.store import Store
from receipts.timing import TimingSettings
from tests.eventually import eventually
from tests.integration.delivery.conftest import driver_histories, running_stack, wait_for_status
from tests.integration.delivery.receiver import Receiver
from tests.integration.delivery.test_replay import (
    activities_scheduled,
    continued_as_new,
    prepared,
    replay_sandboxed,
    task,
    timers,
)
from tests.integration.helpers import put

DEAD = "dead-delivery"


def branches(histories: list[WorkflowHistory]) -> list[tuple[str | None, int, bool, list[str]]]:
    """Per run: what its read of the job decided, its timers, whether it continued as new, and
    the activities it scheduled (sorted: `dispatched` is posted beside the attempt)."""
    return [
        (prepared(h), timers(h), continued_as_new(h), sorted(activities_scheduled(h)))
        for h in histories
    ]


def record(histories: list[WorkflowHistory], names: list[str]) -> None:
    record_to = os.environ.get("RECEIPT_RECORD_HISTORIES")
    if not record_to:
        return
    for run, (history, name) in enumerate(zip(histories, names, strict=True)):
        recorded = {"workflowId": history.workflow_id, "history": history.to_json_dict()}
        path = Path(record_to) / f"jobdriver-{name}-{run}.json"
        path.write_text(json.dumps(recorded, indent=1) + "\n")


def events(receiver: Receiver) -> list[str]:
    return [json.loads(r.body)["event"] for r in receiver.requests]


async def test_a_driver_waits_out_a_dead_deliverys_lease_ends_it_and_honours_an_abort(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    """ACTIVE (a timer, then continue-as-new), STALE_FAILED with the job requeued (continue-as-
    new), ABORTED at the read (the `canceled` callback)."""
    async with (
        Receiver() as receiver,
        running_stack(
            client, fresh_store, fresh_db, queues=(), dispatcher=False,
            RECEIPT_EVENT_CALLBACK_URL=receiver.url,
        ) as stack,
    ):  # fmt: skip
        job = (await put(fresh_store, maxAttempts=2, payload_extra=task("true"))).job
        leased = await ops.lease(fresh_store, job.job_id, attempt=1, worker_id=DEAD, lease_ms=3_000)
        assert leased.ok
        # An abort of a leased job waits for its delivery to honour it: this one never will.
        abort = await ops.add_command(
            fresh_store, job.job_id, type="abort", reason="stop", organization_id="org-a"
        )
        assert abort.ok
        started = await stack.starter.start(job.job_id)
        assert started.created and started.workflow_id
        histories = await driver_histories(client, started.workflow_id)
        await receiver.wait_for(1)
    settled = await wait_for_status(fresh_store, job.job_id)
    assert (settled.status, settled.attempt) == ("canceled", 1)
    assert events(receiver) == ["canceled"]
    # The lease may be read live more than once (a late timer): every such run waits.
    *waits, stale, aborted = branches(histories)
    assert waits and set(map(str, waits)) == {str(("active", 1, True, []))}
    assert stale == ("stale_failed", 0, True, [])
    assert aborted == ("aborted", 0, False, ["post_callbacks"])
    await replay_sandboxed(histories)
    record(histories, ["active"] * len(waits) + ["stale-failed", "aborted-at-prepare"])


async def test_a_driver_fails_a_stale_last_attempt_and_posts_failed(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    """STALE_FAILED that settles the job (its last attempt): the `failed` callback, no
    continue-as-new."""
    async with (
        Receiver() as receiver,
        running_stack(
            client, fresh_store, fresh_db, queues=(), dispatcher=False,
            timing=TimingSettings(RECEIPT_RESONATE_ACTIVE_STALE_MS=1_000),
            RECEIPT_EVENT_CALLBACK_URL=receiver.url,
        ) as stack,
    ):  # fmt: skip
        job = (await put(fresh_store, maxAttempts=1, payload_extra=task("true"))).job
        leased = await ops.lease(
            fresh_store, job.job_id, attempt=1, worker_id=DEAD, lease_ms=120_000
        )
        assert leased.ok
        await asyncio.sleep(1.5)  # no heartbeat within the stale window: the lease is stale
        started = await stack.starter.start(job.job_id)
        assert started.created and started.workflow_id
        histories = await driver_histories(client, started.workflow_id)
        await receiver.wait_for(1)
    settled = await wait_for_status(fresh_store, job.job_id)
    assert (settled.status, settled.error) == ("failed", STALE_ERROR)
    assert events(receiver) == ["failed"]
    assert branches(histories) == [("stale_failed", 0, False, ["post_callbacks"])]
    await replay_sandboxed(histories)
    record(histories, ["stale-failed-terminal"])


async def test_a_driver_waits_out_a_retry_delay_and_finds_its_job_canceled_meanwhile(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    """An attempt that asks for a retry delay: the driver's next run finds the job NOT_AVAILABLE
    (a timer, then continue-as-new); an abort while it waits cancels the queued job at once, so
    the run after finds it TERMINAL and posts `canceled`."""

    async def later(ctx: HandlerContext) -> dict[str, Any]:
        raise HandlerError("try later", retryable=True, retry_delay_ms=4_000)

    async with (
        Receiver() as receiver,
        running_stack(
            client, fresh_store, fresh_db, queues=(QUEUE_CODEX,), handlers={"codex": later},
            RECEIPT_EVENT_CALLBACK_URL=receiver.url,
        ),
    ):  # fmt: skip
        job = (await put(fresh_store, maxAttempts=2)).job
        handle = client.get_workflow_handle(driver_workflow_id(job.job_id, 0))

        async def timers_started() -> int:  # in the driver's latest run, once it is started
            try:
                return timers(await handle.fetch_history())
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise
                return 0

        await eventually(
            timers_started,
            lambda started: started == 1,
            timeout=20,
            every=0.1,
            what="the driver waiting for the retry delay",
        )
        abort = await ops.add_command(
            fresh_store, job.job_id, type="abort", reason="stop", organization_id="org-a"
        )
        assert abort.ok
        assert (await fresh_store.get_job(job.job_id)).status == "canceled"  # type: ignore[union-attr]
        histories = await driver_histories(client, handle.id)
        await receiver.wait_for(2)
    assert events(receiver) == ["dispatched", "canceled"]
    assert branches(histories) == [
        # `dispatched` beside the attempt, awaited before the continue-as-new.
        ("dispatch", 0, True, ["execute_attempt", "post_callbacks"]),
        ("not_available", 1, True, []),
        ("terminal", 0, False, ["post_callbacks"]),
    ]
    await replay_sandboxed(histories)
    record(histories, ["callbacks-continued", "not-available", "terminal-at-prepare"])
