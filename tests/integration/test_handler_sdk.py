"""The handler SDK (`receipt_worker`) under the attempt activity, against real PostgreSQL: a
`@handler` settles as the built-in handlers do — its result, `Retry` with its delay, `Fail`, an
exception with its message, its progress rate-limited, its commands consumed once, an abort. The
role-process tests (tests/e2e/test_client_roles.py) run the installed example through the api."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.testing import ActivityEnvironment

from activities.attempt import execution_timeout_message
from activities.handlers.sdk import as_handler
from receipt_worker import Command, Fail, JobContext, Retry, handler
from receipts import operations as ops
from receipts.messages import AttemptStatus
from receipts.store import Store
from tests.integration.helpers import types
from tests.integration.test_attempt_activity import attempt_of, job_of, run


async def delivered(store: Store, declared: Any, **payload: Any) -> tuple[str, Any]:
    job_id = await job_of(store, declared.agent_id, **payload)
    handlers = {declared.agent_id: as_handler(declared)}
    return job_id, await run(store, handlers, attempt_of(job_id, declared.agent_id))


async def test_a_handler_settles_with_its_result_and_its_last_progress(store: Store) -> None:
    @handler("sdk-ok")
    async def ok(job: JobContext) -> dict[str, Any]:
        for step in range(5):  # within half a second: the first is written, the last is kept
            await job.progress(f"step {step}")
        return {"job": job.job_id, "attempt": job.attempt, "kind": job.kind, "n": job.payload["n"]}

    job_id, result = await delivered(store, ok, n=3)
    assert (result.status, result.job_status) == (AttemptStatus.COMPLETED, "completed")
    job = await store.get_job(job_id)
    assert job is not None
    assert job.result == {"job": job_id, "attempt": 1, "kind": "factory.task.run", "n": 3}
    receipts = await store.read_stream(f"jobs/{job_id}")
    progress = [r.data["data"] for r in receipts if r.type == "job.progress"]
    assert progress == ["step 0", "step 4"]
    assert (await types(store, job_id))[-1] == "job.completed"


async def test_retry_requeues_the_job_not_before_its_delay(store: Store) -> None:
    @handler("sdk-retry")
    async def later(job: JobContext) -> None:
        raise Retry("the registry is busy", delay_ms=4000)

    before = datetime.now(UTC)
    job_id, result = await delivered(store, later)
    assert (result.status, result.job_status) == (AttemptStatus.FAILED, "queued")
    job = await store.get_job(job_id)
    assert job is not None and job.error == "the registry is busy"
    assert job.available_at is not None and job.available_at >= before + timedelta(seconds=4)

    @handler("sdk-retry-float")
    async def later_float(job: JobContext) -> None:
        raise Retry("the registry is busy", delay_ms=4000.0)  # a float is that delay too

    before = datetime.now(UTC)
    job_id, _ = await delivered(store, later_float)
    job = await store.get_job(job_id)
    assert job is not None and job.available_at is not None
    assert job.available_at >= before + timedelta(seconds=4)


async def test_progress_held_back_is_written_however_the_handler_ends(store: Store) -> None:
    @handler("sdk-crash")
    async def crash(job: JobContext) -> None:
        await job.progress("first")
        await job.progress("last before the crash")  # within the rate limit: held back
        raise ValueError("boom")

    job_id, result = await delivered(store, crash)
    assert result.job_status == "queued"
    receipts = await store.read_stream(f"jobs/{job_id}")
    progress = [r.data["data"] for r in receipts if r.type == "job.progress"]
    assert progress == ["first", "last before the crash"]


def test_fail_takes_a_result_object_only() -> None:
    """A failed job's result is an object beside its `status`: anything else would be dropped,
    so it is refused where it is made."""
    import pytest

    with pytest.raises(TypeError, match="must be a dict"):
        Fail("bad", result=["line 1", "line 2"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be JSON"):
        Fail("bad", result={"error": ValueError("x")})
    # What the store writes after sanitizing is JSON: bytes (decoded), a key that is no string.
    assert Fail("ok", result={"stdout": b"out", 1: "one"}).result == {"stdout": b"out", 1: "one"}
    for bad in (-1, float("inf"), float("nan"), True):
        with pytest.raises(ValueError, match="at least 0"):
            Retry("later", delay_ms=bad)


async def test_fail_ends_the_job_with_its_message_and_result(store: Store) -> None:
    @handler("sdk-fail")
    async def refuse(job: JobContext) -> None:
        raise Fail("payload.version is required", result={"hint": "1.4.0"})

    job_id, result = await delivered(store, refuse)
    assert (result.status, result.job_status) == (AttemptStatus.FAILED, "failed")
    job = await store.get_job(job_id)
    assert job is not None and job.error == "payload.version is required"
    assert job.result is not None and job.result["hint"] == "1.4.0"


async def test_a_retryable_fail_is_attempted_again_while_attempts_remain(store: Store) -> None:
    @handler("sdk-fail-retryable")
    async def busy(job: JobContext) -> None:
        raise Fail(f"the registry is busy on attempt {job.attempt}", retryable=True)

    job_id, first = await delivered(store, busy)
    assert (first.status, first.job_status) == (AttemptStatus.FAILED, "queued")
    handlers = {"sdk-fail-retryable": as_handler(busy)}
    last = await run(store, handlers, attempt_of(job_id, "sdk-fail-retryable", attempt=2))
    assert last.job_status == "failed"  # its attempts (2 here) spent
    job = await store.get_job(job_id)
    assert job is not None and job.error == "the registry is busy on attempt 2"


async def test_a_fail_whose_result_is_no_longer_json_still_fails_the_job(store: Store) -> None:
    """A result changed after `Fail` checked it is dropped, and the message says so: the job
    ends as the handler asked (it failed the settle and left the job running before)."""

    @handler("sdk-fail-opaque")
    async def refuse(job: JobContext) -> None:
        failure = Fail("payload.version is required", result={})
        assert failure.result is not None
        failure.result["when"] = object()
        raise failure

    job_id, result = await delivered(store, refuse)
    assert (result.status, result.job_status) == (AttemptStatus.FAILED, "failed")
    job = await store.get_job(job_id)
    assert job is not None and job.error is not None
    assert job.error.startswith("payload.version is required (its result is not JSON")


async def test_progress_that_is_not_json_is_refused_at_the_call_even_when_kept_back(
    store: Store,
) -> None:
    """Kept back by the rate limit, data that is not JSON failed only when the handler ended,
    in place of its result; now the call raises, whichever way it would have gone."""
    refused: list[str] = []

    @handler("sdk-progress-opaque")
    async def reports(job: JobContext) -> dict[str, Any]:
        await job.progress("a")  # written
        for data in (object(), {"at": object()}):  # the second within the rate limit: kept
            try:
                await job.progress(data)
            except TypeError as exc:
                refused.append(str(exc))
        await job.progress("b")  # kept, written at the end
        return {"done": True}

    job_id, result = await delivered(store, reports)
    assert (result.status, result.job_status) == (AttemptStatus.COMPLETED, "completed")
    assert len(refused) == 2 and all(r.startswith("progress data is not JSON") for r in refused)
    receipts = await store.read_stream(f"jobs/{job_id}")
    assert [r.data["data"] for r in receipts if r.type == "job.progress"] == ["a", "b"]


async def test_progress_kept_back_is_written_when_the_execution_timeout_cancels(
    store: Store,
) -> None:
    """The last progress of a handler that hangs says where it stopped: written when the
    execution timeout cancels it (it was dropped before)."""

    @handler("sdk-hang")
    async def hangs(job: JobContext) -> None:
        await job.progress("starting")
        await job.progress("stuck at step 7")  # within the rate limit: kept
        await asyncio.sleep(3600)

    job_id = await job_of(store, "sdk-hang")
    handlers = {"sdk-hang": as_handler(hangs)}
    result = await run(store, handlers, attempt_of(job_id, "sdk-hang", execution_timeout_ms=800))
    assert result.job_status == "queued"
    job = await store.get_job(job_id)
    assert job is not None and job.error == execution_timeout_message(800)
    receipts = await store.read_stream(f"jobs/{job_id}")
    progress = [r.data["data"] for r in receipts if r.type == "job.progress"]
    assert progress == ["starting", "stuck at step 7"]


async def test_an_exception_is_retried_then_fails_the_job_with_its_message(store: Store) -> None:
    @handler("sdk-raise")
    async def broken(job: JobContext) -> None:
        raise ValueError(f"bad input on attempt {job.attempt}")

    job_id, first = await delivered(store, broken)
    assert first.job_status == "queued"  # a bug is retried while attempts remain (2 here)
    handlers = {"sdk-raise": as_handler(broken)}
    second = await run(store, handlers, attempt_of(job_id, "sdk-raise", attempt=2))
    assert second.job_status == "failed"
    job = await store.get_job(job_id)
    assert job is not None and job.error == "ValueError: bad input on attempt 2"


async def test_a_kind_the_handler_does_not_take_and_a_result_that_is_not_json_fail(
    store: Store,
) -> None:
    @handler("sdk-kinds", kinds=["factory.integration.validate"])
    async def other(job: JobContext) -> None:
        raise AssertionError("never run")

    job_id, _ = await delivered(store, other)
    job = await store.get_job(job_id)
    assert job is not None and job.status == "failed"
    assert job.error == "agent 'sdk-kinds' does not run kind 'factory.task.run'"

    @handler("sdk-json")
    async def opaque(job: JobContext) -> object:
        return object()

    job_id, _ = await delivered(store, opaque)
    job = await store.get_job(job_id)
    assert job is not None and job.status == "failed"
    assert job.error is not None and job.error.startswith("the result of ")


async def test_commands_reach_the_handler_once_each_in_order(store: Store) -> None:
    seen: list[Command] = []
    asked = asyncio.Event()

    @handler("sdk-steer")
    async def steered(job: JobContext) -> list[str]:
        asked.set()
        async for command in job.commands():
            seen.append(command)
            if command.type == "follow_up":
                break
        async for command in job.commands(wait=False):  # nothing is handed twice
            seen.append(command)
        return [c.command_id for c in seen]

    job_id = await job_of(store, "sdk-steer")
    delivery = asyncio.create_task(
        run(store, {"sdk-steer": as_handler(steered)}, attempt_of(job_id, "sdk-steer"))
    )
    await asyncio.wait_for(asked.wait(), 10)
    for n, kind in enumerate(("steer", "steer", "follow_up")):
        sent = await ops.add_command(
            store, job_id, type=kind, payload={"n": n}, command_id=f"c{n}", organization_id="org-a"
        )
        assert sent.ok
    result = await asyncio.wait_for(delivery, 30)
    assert result.job_status == "completed"
    assert [(c.command_id, c.type, c.payload) for c in seen] == [
        ("c0", "steer", {"n": 0}),
        ("c1", "steer", {"n": 1}),
        ("c2", "follow_up", {"n": 2}),
    ]
    consumed = [
        r for r in await store.read_stream(f"jobs/{job_id}") if r.type == "queue.command.consumed"
    ]
    assert sorted(r.data["commandId"] for r in consumed) == ["c0", "c1", "c2"]


async def test_an_abort_cancels_the_handler(store: Store) -> None:
    running = asyncio.Event()
    cancelled = asyncio.Event()

    @handler("sdk-abort")
    async def forever(job: JobContext) -> None:
        running.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    job_id = await job_of(store, "sdk-abort")
    delivery = asyncio.create_task(
        run(store, {"sdk-abort": as_handler(forever)}, attempt_of(job_id, "sdk-abort"))
    )
    await asyncio.wait_for(running.wait(), 10)
    assert (await ops.add_command(store, job_id, type="abort", organization_id="org-a")).ok
    result = await asyncio.wait_for(delivery, 30)
    assert cancelled.is_set()
    assert (result.status, result.job_status) == (AttemptStatus.CANCELED, "canceled")


async def test_a_handler_not_declared_sandboxed_runs_no_command(store: Store) -> None:
    @handler("sdk-nosandbox")
    async def sneaky(job: JobContext) -> None:
        await job.run_sandboxed(["true"])

    job_id, _ = await delivered(store, sneaky)
    job = await store.get_job(job_id)
    assert job is not None and job.status == "failed"
    assert job.error is not None and "sandbox=True" in job.error


async def test_a_handler_that_calls_sys_exit_fails_its_attempt_not_the_worker(
    store: Store,
) -> None:
    """`sys.exit` in a handler (argparse on bad input does it) ended the worker's event loop and
    every attempt it ran; it is the handler's failure now, retried as an exception is."""
    import argparse

    @handler("sdk-exit")
    async def exits(job: JobContext) -> None:
        parser = argparse.ArgumentParser(prog="release", exit_on_error=False)
        parser.add_argument("version")
        parser.parse_args([])  # no version: argparse prints its usage and exits 2

    beside = asyncio.create_task(asyncio.sleep(0.2, result="still running"))
    job_id, result = await delivered(store, exits)
    assert (result.status, result.job_status) == (AttemptStatus.FAILED, "queued")
    job = await store.get_job(job_id)
    assert job is not None and job.error is not None
    assert job.error.startswith("SystemExit: 2") and "may not end its worker" in job.error
    assert await beside == "still running"


async def test_progress_kept_back_is_written_when_the_half_second_is_up(store: Store) -> None:
    """Progress held back by the rate limit is written once the limit lets it, not only at the
    handler's next call or its end: a long step shows where it is while it runs."""
    in_step, looked = asyncio.Event(), asyncio.Event()

    @handler("sdk-long-step")
    async def long_step(job: JobContext) -> None:
        await job.progress("download")
        await job.progress("process")  # within the rate limit: kept
        in_step.set()
        await looked.wait()  # a long step, no call meanwhile

    job_id = await job_of(store, "sdk-long-step")
    handlers = {"sdk-long-step": as_handler(long_step)}
    delivery = asyncio.create_task(run(store, handlers, attempt_of(job_id, "sdk-long-step")))
    await asyncio.wait_for(in_step.wait(), 30)
    await asyncio.sleep(1.2)
    receipts = await store.read_stream(f"jobs/{job_id}")
    looked.set()
    assert (await asyncio.wait_for(delivery, 30)).job_status == "completed"
    assert [r.data["data"] for r in receipts if r.type == "job.progress"] == ["download", "process"]


async def test_a_handler_knows_the_time_it_has_left(store: Store) -> None:
    @handler("sdk-time-left")
    async def left(job: JobContext) -> float:
        return job.time_left()

    job_id = await job_of(store, "sdk-time-left")
    handlers = {"sdk-time-left": as_handler(left)}
    await run(store, handlers, attempt_of(job_id, "sdk-time-left", execution_timeout_ms=4000))
    job = await store.get_job(job_id)
    assert job is not None and isinstance(job.result, float)
    assert 2.0 < job.result <= 4.0, job.result


async def test_progress_and_results_are_bounded(store: Store) -> None:
    """A handler's progress (a receipt every half second) and result (the job's row, every read
    of it) had no bound but PostgreSQL's: 64 KiB of progress is refused at the call, a result
    over 1 MiB fails the job, not retried."""
    refused: list[str] = []

    @handler("sdk-heavy")
    async def heavy(job: JobContext) -> str:
        try:
            await job.progress("x" * 70_000)
        except TypeError as exc:
            refused.append(str(exc))
        return "y" * (1024 * 1024 + 1)

    job_id, result = await delivered(store, heavy)
    assert refused == [
        "progress data holds more than 65536 values and characters (over 65536 bytes of "
        "JSON); at most 65536 are kept"
    ]
    assert result.job_status == "failed"
    job = await store.get_job(job_id)
    assert job is not None and job.error is not None and "at most 1048576 are kept" in job.error
    receipts = await store.read_stream(f"jobs/{job_id}")
    assert [r for r in receipts if r.type == "job.progress"] == []


async def test_a_sandboxed_handler_s_command_is_checked_before_it_runs(store: Store) -> None:
    """What a handler passes `run_sandboxed` it can run or fails the job naming why (a string
    argv was split into characters, a non-string env raised a retried TypeError), and its
    program is held to the organization's allow-list as a command a request names is (the
    list was checked on `payload.task.command` only, which a handler need not read)."""
    from activities.attempt import AttemptActivities
    from activities.handlers.context import HandlerSettings
    from receipts.settings import FactorySettings

    calls: list[dict[str, Any]] = [
        {"argv": "echo hi"},
        {"argv": ["echo", 1]},
        {"argv": ["echo"], "env": {"N": 1}},
        {"argv": ["echo"], "stdin": 5},
        {"argv": ["curl", "https://example.com"]},
    ]

    @handler("sdk-runner", sandbox=True, group="codex")
    async def runner(job: JobContext) -> None:
        call = dict(job.payload["call"])
        await job.run_sandboxed(call.pop("argv"), **call)

    settings = HandlerSettings(factory=FactorySettings(org_executables={"org-a": ["pytest"]}))
    errors = []
    for call in calls:
        job_id = await job_of(store, "sdk-runner", call=call)
        env = ActivityEnvironment()
        env.info = dataclasses.replace(env.info, attempt=1, activity_id="attempt:1")
        activities = AttemptActivities(store, {"sdk-runner": as_handler(runner)}, settings=settings)
        result = await env.run(activities.execute_attempt, attempt_of(job_id, "sdk-runner"))
        assert result.job_status == "failed", call  # not retried: the handler's own mistake
        job = await store.get_job(job_id)
        assert job is not None
        errors.append(job.error)
    assert errors == [
        "run_sandboxed(argv): a non-empty list of strings (no shell), not a string",
        "run_sandboxed(argv): every part must be a string",
        "run_sandboxed(env=...): a mapping of strings to strings",
        "run_sandboxed(stdin=...): a string",
        "argv[0] must be one of this organization's executables: pytest",
    ]


async def test_the_release_bot_reads_a_note_steered_during_its_last_step(store: Store) -> None:
    """examples/release-bot: "while it runs, a steer {"note": ...} adds a line to the release
    notes". It read its commands before each step only: a note steered while the last step ran
    was accepted (202), never read, and the release completed without it."""
    from release_bot import release

    job_id = await job_of(store, "release-bot", version="1.2.3", steps=["build"], stepSeconds=1.5)
    delivery = asyncio.create_task(
        run(store, {"release-bot": as_handler(release)}, attempt_of(job_id, "release-bot"))
    )
    for _ in range(100):  # until the last (only) step has started
        if "job.progress" in await types(store, job_id):
            break
        await asyncio.sleep(0.05)
    sent = await ops.add_command(
        store, job_id, type="steer", payload={"note": "late"}, command_id="late-note",
        organization_id="org-a",
    )  # fmt: skip
    assert sent.ok
    result = await asyncio.wait_for(delivery, 30)
    assert result.job_status == "completed"
    job = await store.get_job(job_id)
    assert job is not None and job.result is not None
    assert job.result["notes"] == ["late"]
