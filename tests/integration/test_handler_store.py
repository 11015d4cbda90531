"""What a handler may write, against real PostgreSQL: its own job only under its attempt's fence."""

from __future__ import annotations

from activities.fence import AttemptFence
from activities.handlers import HandlerContext
from activities.handlers.store import HandlerStore
from receipts import operations as ops
from receipts.store import Store
from tests.integration.helpers import put, types

LEASE = 60_000


async def started(store: Store, worker: str) -> HandlerContext:
    """A handler's context for delivery `worker` of attempt 1 of a new, started job."""
    job = (await put(store)).job
    fence = AttemptFence(store, job.job_id, attempt=1, worker_id=worker)
    out = await fence.start(LEASE, {"role": "test"})
    assert out.ok and out.job is not None
    return HandlerContext(job=out.job, attempt=1, worker_id=worker, store=HandlerStore(fence))


async def test_a_handler_writes_progress_and_consumes_commands_while_it_holds_the_lease(
    store: Store,
) -> None:
    ctx = await started(store, "j:attempt:1/1")
    job_id = ctx.job.job_id
    steer = await ops.add_command(
        store, job_id, type="steer", payload={"say": "hi"}, organization_id=ctx.job.organization_id
    )
    assert steer.ok
    assert await ctx.progress({"output": "working"})
    (pending,) = await ctx.pending_commands()
    assert await ctx.consume(pending.command_id)
    assert await ctx.pending_commands() == ()
    assert (await types(store, job_id))[-3:] == [
        "queue.command",
        "job.progress",
        "queue.command.consumed",
    ]


async def test_a_handler_whose_delivery_was_superseded_writes_nothing_to_its_job(
    store: Store,
) -> None:
    ctx = await started(store, "j:attempt:1/1")
    job_id = ctx.job.job_id
    # Temporal redelivered the attempt: the new delivery takes the lease over (start fence).
    newer = AttemptFence(store, job_id, attempt=1, worker_id="j:attempt:1/2")
    assert (await newer.start(LEASE, {"role": "test"})).ok
    org = ctx.job.organization_id
    assert (await ops.add_command(store, job_id, type="steer", organization_id=org)).ok
    written = await types(store, job_id)
    (pending,) = await ctx.pending_commands()  # reads still work
    assert not await ctx.progress({"output": "late"})
    assert not await ctx.consume(pending.command_id)
    assert await types(store, job_id) == written
