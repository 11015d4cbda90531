"""A credential's `Slots`: a call never waits on a free slot, organizations take turns, and a
waiting call keeps its place."""

from __future__ import annotations

import asyncio
import time

import pytest

from activities import gateway_pool
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


async def three_of_org_a_then_one_of_org_b(slots: Slots) -> list[str]:
    """org-a holds a slot and queues three calls, org-b one after them; org-a's held call ends.
    The organizations in the order their calls got a slot."""
    order: list[str] = []

    async def call(org: str) -> None:
        assert await slots.acquire(org, 60)
        order.append(org)
        await asyncio.sleep(0)
        slots.release(org)

    hogs = [asyncio.create_task(call("org-a")) for _ in range(3)]
    await asyncio.sleep(0)
    victim = asyncio.create_task(call("org-b"))
    await asyncio.sleep(0)
    slots.release("org-a")
    await asyncio.gather(*hogs, victim)
    return order


async def test_one_slot_goes_to_another_organization_before_the_next_of_the_one_just_served() -> (
    None
):
    """A credential of one slot: org-a's call holds it and org-a has queued more, org-b's one
    call queued after them. Each release dropped org-a to org-b's count (0), and "first come
    among equals" handed the slot to org-a's next call every time: org-b waited behind all of
    them (a 429 'busy' at SLOT_WAIT_S behind a hostile tenant's queue)."""
    slots = Slots(1)
    assert await slots.acquire("org-a", 1)
    order = await three_of_org_a_then_one_of_org_b(slots)
    assert order[0] == "org-b", order


async def test_a_slot_beside_a_long_call_is_shared_between_organizations() -> None:
    """Two slots: org-c's long stream holds one; org-a's calls take turns on the other and
    org-a has queued more; org-b's call, queued after them, waited behind every one."""
    slots = Slots(2)
    assert await slots.acquire("org-c", 1)  # a long stream
    assert await slots.acquire("org-a", 1)
    order = await three_of_org_a_then_one_of_org_b(slots)
    assert order.index("org-b") <= 1, order


async def test_a_waiting_call_keeps_its_place_while_it_looks_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call waits in slices, asking each time whether another credential is free; asked and
    told no, it stays where it was in the queue (a call that left and queued again each slice
    went behind every call that came after it)."""
    monkeypatch.setattr(gateway_pool, "LOOK_AGAIN_S", 0.02)
    slots = Slots(1)
    assert await slots.acquire("org-x", 1)
    asked = 0

    def nowhere_else() -> bool:
        nonlocal asked
        asked += 1
        return False

    first = asyncio.create_task(slots.acquire("org-a", 5, nowhere_else))
    await asyncio.sleep(0.1)  # several slices
    second = asyncio.create_task(slots.acquire("org-a", 5))
    await asyncio.sleep(0)
    slots.release("org-x")
    assert await first and asked >= 2
    assert not second.done(), "the later call went first"
    slots.release("org-a")
    assert await second


async def test_a_call_told_another_credential_is_free_leaves_the_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gateway_pool, "LOOK_AGAIN_S", 0.02)
    slots = Slots(1)
    assert await slots.acquire("org-x", 1)
    started = time.monotonic()
    assert not await slots.acquire("org-a", 5, lambda: True)
    assert time.monotonic() - started < 1.0
    assert not slots.waiting and slots.held == {"org-x": 1}
    slots.release("org-x")
    assert slots.free
