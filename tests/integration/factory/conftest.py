"""Factory tests: the delivery stack of tests/integration/delivery plus the outbox loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from receipts.enqueue import enqueue, parse_enqueue
from receipts.jobs import Job
from receipts.objectives import store as objectives
from receipts.objectives.model import ObjectiveState
from receipts.store import Store
from roles.delivery.loops import (
    ObjectiveControlOutboxRedrive,
    Ticker,
    objective_control_outbox,
    wake_on_control_requests,
)
from tests.eventually import eventually
from tests.integration.delivery.conftest import (  # noqa: F401  (fixtures)
    Stack,
    client,
    fresh_db,
    fresh_store,
    running_stack,
)

AUTH = {"userId": "u-1", "organizationId": "org-a"}


def objective_dir(workspace_root: Path, objective_id: str, org: str = "org-a") -> Path:
    """Where an objective's tasks run: its organization's tree (activities/workspaces.py)."""
    return workspace_root / "orgs" / org / "objectives" / objective_id


@contextlib.asynccontextmanager
async def outbox_running(stack: Stack) -> AsyncIterator[ObjectiveControlOutboxRedrive]:
    """The worker-control role's outbox loop, woken by control requests, in this process."""
    outbox = ObjectiveControlOutboxRedrive(objective_control_outbox(stack.store), interval_ms=1000)
    wake = asyncio.Event()
    tasks = [
        asyncio.create_task(wake_on_control_requests(stack.listener, wake)),
        asyncio.create_task(Ticker(outbox.name, outbox.run_once, 1000, 0, wake=wake).run()),
    ]
    try:
        yield outbox
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def run_objective(
    store: Store, objective: dict[str, Any], org: str = "org-a", job_id: str | None = None
) -> Job:
    """Enqueue `factory.run` for `objective` (as POST /objectives does); return the run job."""
    body: dict[str, Any] = {
        "payload": {
            "kind": "factory.run",
            "authContext": {**AUTH, "organizationId": org},
            "objective": objective,
        }
    }
    if job_id:
        body["jobId"] = job_id
    return (await enqueue(store, parse_enqueue("factory", body))).job


async def wait_objective(
    store: Store,
    objective_id: str,
    done: tuple[str, ...] = ("completed", "failed", "canceled"),
    timeout: float = 90.0,
    audited: bool = False,
) -> ObjectiveState:
    """Poll the projection until the objective reaches `done` (and its audit, if asked)."""
    state = await eventually(
        lambda: objectives.get(store, objective_id),
        lambda s: s is not None and s.status in done and (not audited or bool(s.audit)),
        timeout=timeout,
        every=0.1,
        what=f"objective {objective_id} reaching {done}",
    )
    assert state is not None
    return state
