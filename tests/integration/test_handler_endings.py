"""How a handler may end, and what it may do after its attempt: each ending settles the attempt."""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from activities.attempt import AttemptActivities
from activities.handlers.context import HandlerSettings
from activities.handlers.sdk import as_handler
from activities.sandbox import SandboxSettings
from receipt_worker import JobContext, handler
from receipts.messages import AttemptStatus
from receipts.store import Store
from tests.integration.test_attempt_activity import attempt_of, job_of, run


async def delivered(store: Store, declared: Any, **payload: Any) -> tuple[str, Any]:
    job_id = await job_of(store, declared.agent_id, **payload)
    handlers = {declared.agent_id: as_handler(declared)}
    return job_id, await run(store, handlers, attempt_of(job_id, declared.agent_id))


class Unprintable(Exception):
    def __init__(self, code: int) -> None:  # forgets super().__init__
        self.code = code

    def __str__(self) -> str:
        return f"code {self.code}: {self.detail}"  # type: ignore[attr-defined]


class NotAnException(BaseException):
    pass


async def cancelled_by_someone_else(job: JobContext) -> None:
    inner = asyncio.create_task(asyncio.sleep(10))
    asyncio.get_running_loop().call_later(0.05, inner.cancel)
    await inner  # raises CancelledError here; nobody cancelled the handler


async def unprintable(job: JobContext) -> None:
    raise Unprintable(7)


async def base_exception(job: JobContext) -> None:
    raise NotAnException("not an Exception")


@pytest.mark.parametrize(
    ("function", "error"),
    [
        (cancelled_by_someone_else, "CancelledError: "),
        (unprintable, "Unprintable: "),
        (base_exception, "NotAnException: not an Exception"),
    ],
)
async def test_however_a_handler_raises_its_attempt_settles_and_the_lease_is_let_go(
    store: Store, function: Any, error: str
) -> None:
    """The README: any other exception is retried while attempts remain, then fails the job
    with `Type: message`. These left the job running under a lease nobody held (the activity
    raised) until the lease expired, each attempt run twice by Temporal's redelivery."""
    declared = handler(f"audit-{function.__name__.replace('_', '-')}")(function)
    job_id, result = await delivered(store, declared)
    assert (result.status, result.job_status) == (AttemptStatus.FAILED, "queued")
    job = await store.get_job(job_id)
    assert job is not None and job.lease is None
    assert job.error is not None and job.error.startswith(error), job.error


async def test_a_failure_s_error_text_is_bounded(store: Store) -> None:
    @handler("audit-huge-error")
    async def huge(job: JobContext) -> None:
        raise ValueError("x" * 5_000_000)

    job_id, result = await delivered(store, huge)
    assert result.job_status == "queued"
    job = await store.get_job(job_id)
    assert job is not None and job.error is not None
    assert len(job.error) < 5_000 and job.error.startswith("ValueError: xxx")
    assert result.error is not None and len(result.error) < 5_000  # Temporal's payload too
    (failed,) = [r for r in await store.read_stream(f"jobs/{job_id}") if r.type == "job.failed"]
    assert len(failed.data["error"]) < 5_000


async def test_a_handler_left_running_after_its_attempt_runs_no_command(store: Store) -> None:
    """A handler that swallows its cancellation is abandoned; it must not go on running
    commands in the job's workspace once its attempt has settled (the next attempt may be
    running there)."""
    ran: list[Any] = []

    @handler("audit-late-runner", sandbox=True, group="codex")
    async def late(job: JobContext) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # swallowed: the execution timeout cannot stop it
        await asyncio.sleep(7)  # the attempt has settled and let the job go by now
        try:
            ran.append(await job.run_sandboxed(["sh", "-c", "echo late > late.txt"]))
        except Exception as exc:
            ran.append(exc)

    root = Path(tempfile.mkdtemp(prefix="audit-ws-", dir="/tmp"))
    await asyncio.to_thread(root.chmod, 0o755)  # traversable by the sandbox's uid
    settings = HandlerSettings(sandbox=SandboxSettings(RECEIPT_WORKSPACE_ROOT=root))
    job_id = await job_of(store, "audit-late-runner")
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=1, activity_id="attempt:1")
    activities = AttemptActivities(
        store, {"audit-late-runner": as_handler(late)}, settings=settings
    )
    attempt = attempt_of(job_id, "audit-late-runner", execution_timeout_ms=1000)
    result = await env.run(activities.execute_attempt, attempt)
    assert result.status == AttemptStatus.EXECUTION_TIMEOUT
    for _ in range(60):
        if ran:
            break
        await asyncio.sleep(0.5)
    assert await asyncio.to_thread(lambda: list(root.rglob("late.txt"))) == []
    assert len(ran) == 1 and not hasattr(ran[0], "exit_code"), ran


async def test_time_left_can_be_asked_from_a_worker_thread(store: Store) -> None:
    @handler("audit-thread-time")
    async def threaded(job: JobContext) -> Any:
        return await asyncio.to_thread(job.time_left)  # blocking work, as the README advises

    job_id, _ = await delivered(store, threaded)
    job = await store.get_job(job_id)
    assert job is not None
    assert job.status == "completed", job.error
    assert isinstance(job.result, float) and 0 < job.result <= 5


@pytest.mark.parametrize("depth", [260, 400])
async def test_a_result_nested_too_deep_to_store_fails_the_job_not_the_settle(
    store: Store, depth: int
) -> None:
    """json.dumps takes it, so the SDK's check let it through; the job's state (pydantic,
    at most 255 levels) could not be written: the settle raised, the job stayed running under a
    lease nobody held until it expired, each attempt run twice."""

    @handler(f"audit-deep-{depth}")
    async def deep(job: JobContext) -> Any:
        value: Any = "bottom"
        for _ in range(depth):
            value = {"k": value}
        return value

    job_id, result = await delivered(store, deep)
    assert result.job_status == "failed"  # the handler's own mistake: not retried
    job = await store.get_job(job_id)
    assert job is not None and job.lease is None
    assert job.error is not None and "levels deep" in job.error


async def test_a_result_or_progress_that_holds_itself_fails_the_job_not_the_worker(
    store: Store,
) -> None:
    """The SDK's depth check walked a self-referring value for ever on the worker's event loop
    (no heartbeat, no other attempt, no settle): progress is refused at the call, the result
    fails the job, not retried. (Before the fix this test never ends.)"""
    refused: list[str] = []

    @handler("audit-itself")
    async def itself(job: JobContext) -> Any:
        state: dict[str, Any] = {"step": 1}
        state["self"] = state
        try:
            await job.progress(state)
        except TypeError as exc:
            refused.append(str(exc))
        return state

    job_id, result = await asyncio.wait_for(delivered(store, itself), 60)
    assert result.job_status == "failed"
    assert refused and "levels deep" in refused[0]
    job = await store.get_job(job_id)
    assert job is not None and job.error is not None and "levels deep" in job.error
