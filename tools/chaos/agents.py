"""The chaos run's background agent jobs: more jobs than slots for one scripted agent (the tests'
tests/agents/scripted_agent.py, run from a registry the run writes), each doing one of the
lifecycle's paths — done, asks and is answered by the load, fails and retries to its budget,
hits quota with a `retryAt`, is cancelled while running, is steered and sent a follow-up — and,
after the drain, the agent-job invariants checked from the chains alone
(tools/chaos/invariants.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from receipts.agent_jobs.model import TERMINAL_STATUSES, session_stream, stream_of
from tools.chaos.invariants import AGENT_JOB_INVARIANTS, agent_job_violations
from tools.chaos.plan import POST_TRIES
from tools.chaos.state import Run

ROOT = Path(__file__).resolve().parents[2]
AGENT = "chaos-agent"
ORGANIZATION = "chaos"
SESSIONS = 4
# (prompt, weight): the scripted agent's modes (tests/agents/scripted_agent.py).
MIX = (
    ("done:ok", 4),
    ("ask:which branch", 2),
    ("fail-delay:300", 1),  # retryable every time: five attempts, then failed
    ("quota:1", 1),  # quota_exhausted with retryAt in 1 s once, then done
    ("sleep:6", 1),  # cancelled while running
    ("steer:0.5", 1),  # its turn waits for a steer; a follow-up then brings a second turn
)
CANCEL_AFTER_S = 2.0
# One agent job for every this many jobs of the load.
EVERY = 3


def write_registry(path: Path) -> Path:
    """A registry whose agent `chaos-agent` runs the scripted agent (its source inline)."""
    source = (ROOT / "tests" / "agents" / "scripted_agent.py").read_text(encoding="utf-8")
    command = ["/usr/bin/python3", "-c", source]
    path.write_text(
        "agents:\n"
        f"  - id: {AGENT}\n"
        f"    command: {json.dumps(command)}\n"
        "    soul: Exact.\n"
        "    mission: Do what the prompt says.\n"
        "    skills: [chaos]\n",
        encoding="utf-8",
    )
    return path


def prompt_of(rng: random.Random) -> str:
    return rng.choices([p for p, _ in MIX], [w for _, w in MIX])[0]


async def post_agent_job(http: httpx.AsyncClient, run: Run, prompt: str, session: str) -> None:
    """POST /agent-jobs (retried: the same sourceToolCallId answers with the same job)."""
    body = {
        "agentId": AGENT,
        "organizationId": ORGANIZATION,
        "ownerSessionId": session,
        "sourceActorEventId": "chaos",
        "sourceToolCallId": f"tool-{uuid.uuid4().hex[:12]}",
        "replyRoute": {"binding": "chaos", "channel": "c"},
        "input": {"prompt": prompt},
    }
    for _ in range(POST_TRIES):
        try:
            response = await http.post(f"{run.api_url}/agent-jobs", json=body, timeout=10)
        except httpx.HTTPError as exc:
            run.refused[f"agent-job {type(exc).__name__}"] += 1
            await asyncio.sleep(0.5)
            continue
        if response.status_code in (200, 201):
            job_id = str(response.json()["agentJob"]["agentJobId"])
            run.agent_jobs[job_id] = prompt
            # The runtime's id of the session (scoped by organization), as an admin sees it.
            run.sessions.add(str(response.json()["agentJob"]["ownerSessionId"]))
            if prompt.startswith("ask:"):
                await _answer(http, run, job_id)
            elif prompt.startswith("sleep:"):
                await _cancel_later(http, run, job_id)
            elif prompt.startswith("steer:"):
                await _steer(http, run, job_id)
            return
        run.refused[f"agent-job {response.status_code}"] += 1
        await asyncio.sleep(0.5)


async def _get(http: httpx.AsyncClient, run: Run, job_id: str) -> dict[str, Any] | None:
    with contextlib.suppress(httpx.HTTPError, ValueError):
        response = await http.get(f"{run.api_url}/agent-jobs/{job_id}", timeout=10)
        if response.status_code == 200:
            found: dict[str, Any] = response.json()
            return found
    return None


async def _answer(http: httpx.AsyncClient, run: Run, job_id: str) -> None:
    """Answer the job's question once it waits (faults may delay that for a while)."""
    deadline = time.monotonic() + run.config.drain_timeout_s
    while time.monotonic() < deadline:
        job = await _get(http, run, job_id)
        if job is not None and job.get("status") in TERMINAL_STATUSES:
            return
        if job is not None and job.get("status") == "waiting_on_user":
            pending = job.get("pendingToolCall") or {}
            body = {"answer": "main", "toolCallId": pending.get("toolCallId")}
            with contextlib.suppress(httpx.HTTPError):
                response = await http.post(
                    f"{run.api_url}/agent-jobs/{job_id}/input", json=body, timeout=10
                )
                if response.status_code in (200, 202):
                    return
        await asyncio.sleep(0.5)


async def _steer(http: httpx.AsyncClient, run: Run, job_id: str) -> None:
    """Once the job's turn runs, send its queue job a steer (the turn reads it on stdin) and a
    follow-up (the next turn answers it)."""
    deadline = time.monotonic() + run.config.drain_timeout_s
    while time.monotonic() < deadline:
        job = await _get(http, run, job_id)
        if job is None or job.get("status") != "running" or not job.get("queueJobId"):
            if job is not None and job.get("status") in TERMINAL_STATUSES:
                return
            await asyncio.sleep(0.5)
            continue
        turn_job = quote(str(job["queueJobId"]), safe="")
        for kind in ("steer", "follow_up"):
            body = {"type": kind, "payload": {"text": f"chaos {kind}"}}
            with contextlib.suppress(httpx.HTTPError):
                response = await http.post(
                    f"{run.api_url}/jobs/{turn_job}/commands", json=body, timeout=10
                )
                if response.status_code == 202:
                    run.agent_commands[kind] += 1
                else:
                    run.refused[f"agent-job {kind} {response.status_code}"] += 1
        return


async def _cancel_later(http: httpx.AsyncClient, run: Run, job_id: str) -> None:
    await asyncio.sleep(CANCEL_AFTER_S)
    for _ in range(5):
        with contextlib.suppress(httpx.HTTPError):
            response = await http.post(
                f"{run.api_url}/agent-jobs/{job_id}/cancel",
                json={"reason": "chaos cancel"},
                timeout=10,
            )
            if response.status_code in (200, 202, 409):
                return
        await asyncio.sleep(1)


async def open_agent_jobs(run: Run) -> list[str]:
    """The load's agent jobs still neither terminal nor waiting on their user."""
    assert run.store is not None
    still = []
    for job_id in run.agent_jobs:
        try:
            chain = await run.store.read_stream(stream_of(job_id))
        except Exception:
            still.append(job_id)
            continue
        status = "queued"
        for receipt in chain:
            if receipt.type == "agent_job.transitioned":
                status = str(receipt.data["to"])
        if status not in TERMINAL_STATUSES and status != "waiting_on_user":
            still.append(job_id)
    return still


async def agent_job_lines(run: Run) -> list[tuple[bool, str]]:
    """The agent-job invariants over the load's chains and its sessions' wakeups."""
    assert run.store is not None
    chains = {j: await run.store.read_stream(stream_of(j)) for j in run.agent_jobs}
    wakeups = [r for s in run.sessions for r in await run.store.read_stream(session_stream(s))]
    found = agent_job_violations(chains, wakeups)
    finals: dict[str, int] = {}
    for chain in chains.values():
        moves = [str(r.data["to"]) for r in chain if r.type == "agent_job.transitioned"]
        final = moves[-1] if moves else "queued"
        finals[final] = finals.get(final, 0) + 1
    commands = dict(run.agent_commands)
    lines = [
        (
            True,
            f"agent jobs: {len(chains)} (final: {finals}, wakeups {len(wakeups)}, "
            f"commands to their turns {commands})",
        )
    ]
    for name in AGENT_JOB_INVARIANTS:
        shown = "; ".join(found.found.get(name, [])[:3])
        lines.append((found.count(name) == 0, f"{name}: {found.count(name)} {shown}".rstrip()))
    return lines
