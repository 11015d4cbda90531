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

from receipts.errors import ReceiptError
from receipts.jobs import TERMINAL_STATUSES
from receipts.objectives import audit as objective_audit
from receipts.objectives import store as objectives
from receipts.objectives.model import run_job_id
from receipts.tenancy import scoped_id
from tools.chaos import agents
from tools.chaos.plan import POST_TRIES, job_mix
from tools.chaos.state import Run


async def post(
    http: httpx.AsyncClient, run: Run, shape: str, extra: dict[str, Any], attempts: int
) -> str | None:
    job_id = f"chaos-{shape}-{uuid.uuid4().hex[:12]}"
    payload = {
        "kind": "factory.task.run",
        "authContext": {"userId": "chaos", "organizationId": "chaos"},
        **extra,
    }
    body = {"jobId": job_id, "maxAttempts": attempts, "payload": payload}
    for _ in range(POST_TRIES):  # a retried enqueue with the same jobId is idempotent
        try:
            response = await http.post(f"{run.api_url}/agents/codex/jobs", json=body, timeout=10)
        except httpx.HTTPError as exc:
            run.refused[type(exc).__name__] += 1
            await asyncio.sleep(0.5)
            continue
        if response.status_code == 202:
            # The runtime's id: job ids are scoped by organization (`<id>~<tag>`).
            runtime_id = scoped_id("chaos", job_id)
            run.accepted[runtime_id] = shape
            return runtime_id
        run.refused[str(response.status_code)] += 1
        await asyncio.sleep(0.5)
    return None


# One objective (a three-task graph with validate) joins the load for every this many jobs.
OBJECTIVE_EVERY = 25


# Every this many objectives, one whose task `c` fails its first try (its budget retries it),
# and one cancelled while it runs.
RETRY_EVERY = 3
CANCEL_EVERY = 4
# `c` of a retrying objective: the first try leaves a mark and fails, the next finds it.
FAIL_ONCE = "test -f c.tried || { touch c.tried; exit 1; }; echo c > c"


def objective_body(objective_id: str, fail_once: bool = False) -> dict[str, Any]:
    """An objective of the load: `a`, then `b` and `c`, then validate (all short commands; each
    task may take three tries, as a job the faults may cost both its attempts). With
    `fail_once`, `c` fails its first try and completes on the next."""
    c_command = ["sh", "-c", FAIL_ONCE if fail_once else "echo c > c"]
    return {
        "objectiveId": objective_id,
        "title": "chaos objective",
        "goal": "a, then b and c, then validate",
        "authContext": {"userId": "chaos", "organizationId": "chaos"},
        "tasks": [
            {"taskId": "a", "maxAttempts": 3, "input": {"command": ["sleep", "1"]}},
            {"taskId": "b", "dependsOn": ["a"], "maxAttempts": 3, "input": {"command": ["true"]}},
            {
                "taskId": "c",
                "dependsOn": ["a"],
                "maxAttempts": 3,
                "input": {"command": c_command},
            },
        ],
        "validate": {"command": ["test", "-f", "c"]},
    }


async def post_objective(http: httpx.AsyncClient, run: Run, number: int) -> None:
    """POST /objectives (a re-post of the same objectiveId returns the same run job); every
    RETRY_EVERY-th has a task that needs its retry budget, every CANCEL_EVERY-th is cancelled
    while it runs."""
    objective_id = f"chaos-{uuid.uuid4().hex[:12]}"
    body = objective_body(objective_id, fail_once=number % RETRY_EVERY == 1)
    for _ in range(POST_TRIES):
        try:
            response = await http.post(f"{run.api_url}/objectives", json=body, timeout=10)
        except httpx.HTTPError as exc:
            run.refused[type(exc).__name__] += 1
            await asyncio.sleep(0.5)
            continue
        if response.status_code == 202:
            # The runtime's id: objective ids are scoped by organization as job ids are.
            run.objectives.append(scoped_id("chaos", objective_id))
            if number % CANCEL_EVERY == 2:
                await _cancel_objective_later(http, run, objective_id)
            return
        run.refused[f"objective {response.status_code}"] += 1
        await asyncio.sleep(0.5)


async def _cancel_objective_later(http: httpx.AsyncClient, run: Run, objective_id: str) -> None:
    """Cancel the objective once its first task has had time to start."""
    await asyncio.sleep(3.0)
    for _ in range(POST_TRIES):
        with contextlib.suppress(httpx.HTTPError):
            response = await http.post(
                # The load runs open (an admin caller): it names the runtime's id.
                f"{run.api_url}/objectives/{scoped_id('chaos', objective_id)}/cancel",
                json={"reason": "chaos cancel"},
                timeout=10,
            )
            if response.status_code < 500:
                run.objective_cancels[str(response.status_code)] += 1
                return
        await asyncio.sleep(0.5)


async def objective_jobs(run: Run) -> list[str]:
    """The jobs of the load's objectives: each run job, task try and step."""
    assert run.store is not None
    ids: list[str] = []
    for objective_id in run.objectives:
        state = await objectives.get(run.store, objective_id)
        ids.append(run_job_id(objective_id))
        if state is not None:
            ids += objective_audit.job_ids(state)
    return ids


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
    posted = 0
    while run.elapsed() < run.config.duration_s:
        posted += 1
        if posted % OBJECTIVE_EVERY == 1:
            number = posted // OBJECTIVE_EVERY
            objective = asyncio.create_task(post_objective(http, run, number))
            pending.add(objective)
            objective.add_done_callback(pending.discard)
        if posted % agents.EVERY == 0:
            session = f"chaos-session-{posted % agents.SESSIONS}"
            agent_job = asyncio.create_task(
                agents.post_agent_job(http, run, agents.prompt_of(rng), session)
            )
            pending.add(agent_job)
            agent_job.add_done_callback(pending.discard)
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
    while time.monotonic() < deadline:
        try:  # a fault (a database restart) may still be settling: ask again
            states = [await objectives.get(run.store, o) for o in run.objectives]
        except ReceiptError:
            await asyncio.sleep(1)
            continue
        if all(s is not None and s.terminal and s.audit is not None for s in states):
            break
        await asyncio.sleep(1)
    while time.monotonic() < deadline:  # the agent jobs: each terminal or waiting
        if not await agents.open_agent_jobs(run):
            break
        await asyncio.sleep(1)
    open_jobs = list(run.accepted) + await objective_jobs(run)
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
