"""A step of one agent job in a dispatcher pass: what it raises is counted and logged, and the
pass goes on to the next job (it ended the pass before: one job failing every time held back
every tenant's claims); a cancellation is not swallowed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from roles.delivery.agent_jobs import AgentJobDispatcher, DispatchPass


async def test_a_failing_step_is_counted_and_the_pass_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dispatcher = AgentJobDispatcher(store=None, listener=None)  # type: ignore[arg-type]
    result = DispatchPass()
    done: list[str] = []
    for job_id, fails in (("a", True), ("b", False)):
        async with dispatcher._each(result, job_id, "claim"):
            if fails:
                raise RuntimeError("a corrupt row")
            done.append(job_id)
    assert done == ["b"] and result.failed == 1
    [record] = [
        r for r in caplog.records if getattr(r, "event", "") == "agent_job.dispatch_step_failed"
    ]
    fields: Any = record
    assert (fields.agentJobId, fields.step) == ("a", "claim")
    with pytest.raises(asyncio.CancelledError):
        async with dispatcher._each(result, "c", "settle"):
            raise asyncio.CancelledError
