"""A credential's `Slots`: a call never waits on a free slot."""

from __future__ import annotations

import asyncio

from activities.gateway_pool import Slots


async def test_a_call_arriving_as_a_cancelled_waiter_leaves_gets_the_free_slot() -> None:
    """A's call holds the one slot, B's waits; B's request is cancelled and A's answer is sent
    in the same turn of the loop, C's call already on its way in: B's entry is still listed
    (its task has not run), so C waited on the free slot, and no release ever came to hand it
    over (429 'busy' after SLOT_WAIT_S on an idle credential; every later call queued behind
    C, the same)."""
    slots = Slots(1)
    assert await slots.acquire("org-a", 1)
    b = asyncio.create_task(slots.acquire("org-b", 60))
    await asyncio.sleep(0)  # B waits
    c = asyncio.create_task(slots.acquire("org-c", 1))  # its step queued before B's wake-up
    b.cancel()
    slots.release("org-a")
    assert await c, "an idle credential refused the call"
    assert slots.busy == 1 and slots.held["org-c"] == 1
    assert b.cancelled() and not slots.waiting
