"""The chaos load: a seeded mix of quick, slow, failing and aborted jobs at a fixed rate, and the
wait for the queue to drain."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from typing import Any

import httpx

from receipts.jobs import TERMINAL_STATUSES
from tools.chaos.plan import job_mix
from tools.chaos.state import Run


async def post(
    http: httpx.AsyncClient, run: Run, shape: str, extra: dict[str, Any], attempts: int
) -> str | None:
    job_id = f"chaos-{shape}-{uuid.uuid4().hex[:12]}"
    payload = {
        "kind": "factory.task.run",
        "authContext": {"userId": "chaos", "organizationId": "chaos"},
        "objectiveId": "chaos",  # objective-scoped kinds need one (422 without)
        **extra,
    }
    body = {"jobId": job_id, "maxAttempts": attempts, "payload": payload}
    for _ in range(3):  # a retried enqueue with the same jobId is idempotent
        try:
            response = await http.post(f"{run.api_url}/agents/codex/jobs", json=body, timeout=10)
        except httpx.HTTPError as exc:
            run.refused[type(exc).__name__] += 1
            await asyncio.sleep(0.5)
            continue
        if response.status_code == 202:
            run.accepted[job_id] = shape
            return job_id
        run.refused[str(response.status_code)] += 1
        await asyncio.sleep(0.5)
    return None


async def _abort_later(http: httpx.AsyncClient, run: Run, job_id: str) -> None:
    await asyncio.sleep(1.5)
    for _ in range(5):
        with contextlib.suppress(httpx.HTTPError):
            response = await http.post(
                f"{run.api_url}/jobs/{job_id}/commands",
                json={"type": "abort", "reason": "chaos abort"},
                timeout=10,
            )
            if response.status_code in (202, 409):
                return
        await asyncio.sleep(1)


async def load(run: Run, http: httpx.AsyncClient) -> None:
    rng = random.Random(run.config.seed + 1)
    pending: set[asyncio.Task[Any]] = set()
    interval = 1 / run.config.rate
    next_at = time.monotonic()
    while run.elapsed() < run.config.duration_s:
        shape, extra, attempts = job_mix(rng)

        async def one(
            shape: str = shape, extra: dict[str, Any] = extra, attempts: int = attempts
        ) -> None:
            job_id = await post(http, run, shape, extra, attempts)
            if job_id and shape == "aborted":
                await _abort_later(http, run, job_id)

        task = asyncio.create_task(one())
        pending.add(task)
        task.add_done_callback(pending.discard)
        next_at += interval
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    await asyncio.gather(*pending, return_exceptions=True)


async def drain(run: Run) -> list[str]:
    assert run.store is not None
    deadline = time.monotonic() + run.config.drain_timeout_s
    open_jobs = list(run.accepted)
    while open_jobs and time.monotonic() < deadline:
        still = []
        for job_id in open_jobs:
            try:
                job = await run.store.get_job(job_id)
            except Exception:
                still.append(job_id)
                continue
            if job is None or job.status not in TERMINAL_STATUSES:
                still.append(job_id)
        open_jobs = still
        if open_jobs:
            await asyncio.sleep(1)
    return open_jobs
