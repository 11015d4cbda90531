"""A release bot: two agents written with Receipt's handler SDK.

`release-bot` walks a release through its steps, reporting each as progress. While it runs, a
steer `{"note": "..."}` adds a line to the release notes and `{"skip": "<step>"}` skips a step
not yet started; each steer is read once. A registry that is busy makes it retry later.

`release-check` runs the release's check command (`payload.check`, an argv chosen by the
caller) in Receipt's command sandbox, on the worker group that runs commands (codex), and fails
the job when it fails.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from receipt_worker import Fail, JobContext, Retry, handler

STEPS = ("build", "tag", "publish")
VERSION = re.compile(r"^\d+\.\d+\.\d+$")


@handler("release-bot", kinds=["factory.task.run"])
async def release(job: JobContext) -> dict[str, Any]:
    """Release `payload.version` through `payload.steps` (default build, tag, publish), each
    taking `payload.stepSeconds` (default 1). `payload.registryBusyAttempts: n` stands for a
    registry that refuses the first n attempts: they end with `Retry` after 2 s."""
    version = job.payload.get("version")
    if not isinstance(version, str):
        raise Fail("payload.version is required: the version to release, e.g. 1.4.0")
    if not VERSION.match(version):
        raise ValueError(f"not a release version: {version!r} (expected MAJOR.MINOR.PATCH)")
    if job.attempt <= int(job.payload.get("registryBusyAttempts", 0)):
        raise Retry("the registry is busy", delay_ms=2000)
    steps = list(job.payload.get("steps", STEPS))
    pause = float(job.payload.get("stepSeconds", 1))
    notes: list[str] = []
    done: list[str] = []
    skipped: set[str] = set()
    for step in steps:
        await read_steers(job, notes, skipped)
        if step in skipped:
            await job.progress({"step": step, "skipped": True})
            continue
        await job.progress({"step": step, "version": version})
        await asyncio.sleep(pause)
        done.append(step)
    await read_steers(job, notes, skipped)  # a note steered while the last step ran
    return {"released": version, "steps": done, "notes": notes, "attempt": job.attempt}


async def read_steers(job: JobContext, notes: list[str], skipped: set[str]) -> None:
    """The steers sent since the last look: each note a line of the notes, each skip a step."""
    async for command in job.commands(wait=False):
        steer = command.payload if isinstance(command.payload, dict) else {}
        if "note" in steer:
            notes.append(str(steer["note"]))
        if "skip" in steer:
            skipped.add(str(steer["skip"]))


@handler("release-check", kinds=["factory.task.run"], sandbox=True, group="codex")
async def check(job: JobContext) -> dict[str, Any]:
    """Run `payload.check` (argv) in the sandbox, in the job's workspace."""
    argv = job.payload.get("check")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise Fail("payload.check must be a non-empty list of strings (argv)")
    ran = await job.run_sandboxed(argv)
    if ran.exit_code != 0:
        raise Fail(
            f"the check exited with status {ran.exit_code}", result={"tail": ran.output_tail}
        )
    return {"passed": True, "tail": ran.output_tail}
