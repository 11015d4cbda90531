"""The dispatcher's refills when settles come faster than its starts. Every settle of an
organization's job runs `fairness.freed`, which names that organization's oldest waiting jobs
holding no slot yet; a job it named earlier, whose dispatch still waits for one of the
dispatcher's slots, holds none, so the next settle named it again, and the one after. Draining a
12 000-job backlog of four organizations with the real roles, the driver made 2 989 starts, and
11 614 `active_delivery` and 8 982 `terminal` refusals besides (seven wasted starts, each a
database round trip and most a Temporal describe, per job started)."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import pytest

from receipts.listen import Listener
from receipts.settings import Settings
from roles.delivery import dispatcher as dispatching
from roles.delivery.starter import StartResult


class SlowStarter:
    """A starter whose starts take a moment, counting the starts of each job."""

    def __init__(self) -> None:
        self.settings = Settings()
        self.starts: collections.Counter[str] = collections.Counter()

    async def start(self, job_id: str) -> StartResult:
        self.starts[job_id] += 1
        await asyncio.sleep(0.01)
        return StartResult(True, None, job_id, 0)


async def test_overlapping_refills_start_each_freed_job_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Five settles of one organization, each refill naming the same two waiting jobs (none has
    taken its slot yet: their starts wait for the dispatcher's): each job is started once."""

    async def same_two(*_: Any, **__: Any) -> list[str]:
        return ["waiting-1", "waiting-2"]

    monkeypatch.setattr(dispatching.fairness, "freed", same_two)
    starter = SlowStarter()
    dispatcher = dispatching.Dispatcher(
        None,  # type: ignore[arg-type]
        Listener("postgresql://unused"),
        starter,  # type: ignore[arg-type]
        concurrency=1,
    )
    await asyncio.gather(*(dispatcher._refill(f"settled-{n}") for n in range(5)))
    assert starter.starts == {"waiting-1": 1, "waiting-2": 1}
    # Nothing is kept once the starts are done: a process that dispatched many jobs keeps none.
    assert not dispatcher._dispatching


async def test_a_job_is_dispatched_again_once_its_earlier_dispatch_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only a dispatch still pending is skipped: once it ended, the job may be dispatched again
    (the rescan's or the redrive's later look starts what an earlier start did not)."""
    starter = SlowStarter()
    dispatcher = dispatching.Dispatcher(
        None,  # type: ignore[arg-type]
        Listener("postgresql://unused"),
        starter,  # type: ignore[arg-type]
    )
    assert await dispatcher._dispatch("job-1")
    assert await dispatcher._dispatch("job-1")
    assert starter.starts == {"job-1": 2}


class HeldThenFree(SlowStarter):
    """A starter whose first start of a job finds its organization's slots taken (held): a
    settle gives one back while that start runs, and its refill names the job again."""

    def __init__(self, dispatcher: Any = None) -> None:
        super().__init__()
        self.dispatcher = dispatcher

    async def start(self, job_id: str) -> StartResult:
        self.starts[job_id] += 1
        if self.starts[job_id] == 1:
            await self.dispatcher._dispatch(job_id)  # the refill, while this start runs
            return StartResult(False, "held", None, None)
        return StartResult(True, None, job_id, 0)


async def test_a_job_named_again_while_its_start_runs_is_started_once_more_after_it() -> None:
    """A start that read the job held (its organization's slots taken) while a settle gave one
    back: the refill that named it was skipped as pending, and the job waited for the redrive.
    It is started once more after the start it overlapped."""
    starter = HeldThenFree()
    dispatcher = dispatching.Dispatcher(
        None,  # type: ignore[arg-type]
        Listener("postgresql://unused"),
        starter,  # type: ignore[arg-type]
    )
    starter.dispatcher = dispatcher
    assert await dispatcher._dispatch("job-1")
    assert starter.starts == {"job-1": 2}
    assert not dispatcher._dispatching and not dispatcher._asked_again
