"""Interleavings of the settle forced on real PostgreSQL: each test pauses one writer at the
point another lands, and checks the invariant the rule promises."""

from __future__ import annotations

import asyncio
from datetime import datetime

from activities.fence import AttemptFence
from activities.settle import Settlement
from receipts import operations as ops
from receipts.jobs import Job
from receipts.store import Store
from tests.integration.helpers import put, types

LEASE = 60_000


class _AbortAfterReread(AttemptFence):
    """A fence whose settle re-read is followed, before the settle's write, by an abort that
    commits (the API's `POST /jobs/{id}/commands` landing in between)."""

    async def reread(self) -> tuple[Job | None, datetime]:
        read = await super().reread()
        sent = await ops.add_command(
            self.store, self.job_id, type="abort", reason="stop", organization_id="org-a"
        )
        assert sent.ok
        return read


async def test_an_abort_committed_between_the_settles_reread_and_its_write_wins(
    store: Store,
) -> None:
    """J34 with X8: the settle's guarded write is refused because the abort moved the head,
    and its second decision is made on the state holding the abort: it must honour it (the
    job canceled), as an abort found by the re-read is, not complete over it."""
    job = (await put(store)).job
    fence = _AbortAfterReread(store, job.job_id, attempt=1, worker_id=f"{job.job_id}:attempt:1/1")
    assert (await fence.start(LEASE, {"role": "test"})).ok

    async def finished() -> dict[str, int]:
        return {"answer": 42}

    handler = asyncio.create_task(finished())
    await asyncio.wait({handler})
    await Settlement(fence).handler_done(handler, 0.1)
    settled = await store.get_job(job.job_id)
    assert settled is not None and settled.abort_requested
    assert settled.status == "canceled", await types(store, job.job_id)
