"""Builders shared by the integration tests."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from typing import Any

from activities.fence import AttemptFence
from activities.handlers.context import HandlerContext, HandlerSettings
from activities.handlers.fenced import FencedReceipts
from receipts import deliveries
from receipts.enqueue import EnqueueResult, enqueue, parse_enqueue
from receipts.kinds import CONTRACTS
from receipts.store import Draft, Store


def new_id(prefix: str = "job") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def adhoc_objective_id(job_id: str | None) -> str:
    """An objective id for a kind that cannot run without one (422 without). The same job id
    gets the same one, so a re-post of a job is the same request."""
    if job_id is None:
        return new_id("adhoc")
    return "adhoc-" + hashlib.sha256(job_id.encode()).hexdigest()[:16]


def auth(org: str = "org-a", user: str = "user-1") -> dict[str, str]:
    return {"userId": user, "organizationId": org}


def body(kind: str = "factory.task.run", org: str = "org-a", **extra: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {"kind": kind, "authContext": auth(org)}
    if kind in CONTRACTS and CONTRACTS[kind].objective_required:
        payload["objectiveId"] = adhoc_objective_id(extra.get("jobId"))
    payload.update(extra.pop("payload_extra", {}))
    return {"payload": payload, **extra}


async def put(store: Store, agent: str = "codex", **kwargs: Any) -> EnqueueResult:
    return await enqueue(store, parse_enqueue(agent, body(**kwargs)))


async def callbacks_owed(
    store: Store, urls: Sequence[str], *, limit: int = 200
) -> list[tuple[str, str]]:
    """`(jobId, event)` of the owed terminal callbacks one read of the recovery loop returns."""
    return (await deliveries.owed_callbacks(store, urls, limit=limit))[0]


async def types(store: Store, job_id: str) -> list[str]:
    return [r.type for r in await store.read_stream(f"jobs/{job_id}")]


async def create_objective(
    store: Store,
    objective_id: str,
    tasks: list[dict[str, Any]] | None = None,
    org: str = "org-a",
    **fields: Any,
) -> str:
    """An objective written straight to its stream (no control requested); one pending task
    `t` running `true` unless `tasks` says otherwise; `fields` (`validate`, `publish`) beside."""
    from receipts.objectives import store as objectives

    created = {
        "objectiveId": objective_id,
        "organizationId": org,
        "authContext": auth(org),
        "title": objective_id,
        "goal": "test",
        "tasks": tasks or [{"taskId": "t", "input": {"command": ["true"]}}],
        **fields,
    }
    async with store.transaction() as tx:
        await objectives.update(tx, objective_id, lambda _: [Draft("objective.created", created)])
    return objective_id


async def started_context(
    store: Store, job_id: str, settings: HandlerSettings | None = None
) -> HandlerContext:
    """The handler context of attempt 1 of `job_id`, started under its fence as a worker starts
    it (its writes hold that fence)."""
    fence = AttemptFence(store, job_id, attempt=1, worker_id=f"{job_id}:attempt:1/1")
    started = await fence.start(60_000, {"role": "test"})
    assert started.ok and started.job is not None
    return HandlerContext(
        job=started.job,
        attempt=1,
        worker_id=fence.worker_id,
        receipts=FencedReceipts(fence),
        settings=settings or HandlerSettings(),
    )
