"""A role process's drain at SIGTERM: a worker's shutdown that never ends is bounded, logged,
and ends the process with exit 1; a task that swallows its cancellation (a handler an attempt
left behind) does not keep a cleanly stopped process alive; closing the runtime is bounded
(real processes, real signals)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from roles.infra import process
from roles.infra.process import (
    EXIT_SHUTDOWN_STUCK,
    Runtime,
    ShutdownStuck,
    run_until,
    until_stopped,
)


async def _forever() -> None:
    await asyncio.Event().wait()


async def test_a_shutdown_that_ends_in_time_ends_the_run(caplog: pytest.LogCaptureFixture) -> None:
    stop, drained = asyncio.Event(), asyncio.Event()

    async def shutdown() -> None:
        drained.set()

    stop.set()
    await asyncio.wait_for(run_until(drained.wait, shutdown, stop, timedelta(seconds=1)), 5)
    assert "role.shutdown_stuck" not in {getattr(r, "event", None) for r in caplog.records}


async def test_a_shutdown_past_the_grace_and_its_margin_raises_and_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(process, "SHUTDOWN_MARGIN", timedelta(seconds=0.2))
    stop = asyncio.Event()
    stop.set()
    started = time.monotonic()
    with pytest.raises(ShutdownStuck):
        await asyncio.wait_for(run_until(_forever, _forever, stop, timedelta(seconds=0.1)), 5)
    assert 0.3 <= time.monotonic() - started < 3
    stuck = [r for r in caplog.records if getattr(r, "event", None) == "role.shutdown_stuck"]
    assert len(stuck) == 1 and stuck[0].levelname == "ERROR"


async def test_until_stopped_cancels_the_work_at_stop_and_raises_an_error_of_its_own() -> None:
    """A driver's dispatcher stops as its worker begins to drain (roles/delivery/serve.py)."""
    stop, cancelled = asyncio.Event(), asyncio.Event()

    async def work() -> None:
        try:
            await _forever()
        finally:
            cancelled.set()

    running = asyncio.create_task(until_stopped(work(), stop))
    await asyncio.sleep(0.05)
    assert not running.done()
    stop.set()
    await asyncio.wait_for(running, 5)
    assert cancelled.is_set()

    async def fails() -> None:
        raise RuntimeError("its own")

    with pytest.raises(RuntimeError, match="its own"):
        await asyncio.wait_for(until_stopped(fails(), asyncio.Event()), 5)


SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from datetime import timedelta
    from roles.infra import logs, process

    process.SHUTDOWN_MARGIN = timedelta(seconds=0.3)

    async def forever() -> None:
        await asyncio.Event().wait()

    async def main(stop: asyncio.Event) -> None:
        logs.configure("test", "json")
        print("ready", flush=True)
        await process.run_until(forever, forever, stop, timedelta(seconds=0.2))

    process.run_until_signalled(main, sys.argv[1])
    """
)


def _stopped(script: str, loop: str) -> tuple[int, list[dict[str, Any]]]:
    """Run `script` (it prints `ready`, then waits for its stop) on `loop`, SIGTERM it; its
    exit status and the JSON log records it wrote."""
    with subprocess.Popen(
        [sys.executable, "-c", script, loop],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as child:
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            child.send_signal(signal.SIGTERM)
            _, stderr = child.communicate(timeout=20)
        finally:
            if child.poll() is None:
                child.kill()
    return child.returncode, [json.loads(line) for line in stderr.splitlines() if line]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_role_whose_shutdown_hangs_exits_1_after_sigterm(loop: str) -> None:
    code, records = _stopped(SCRIPT, loop)
    assert code == EXIT_SHUTDOWN_STUCK
    assert [r.get("event") for r in records] == ["role.draining", "role.shutdown_stuck"]


LEFT_BEHIND = textwrap.dedent(
    """
    import asyncio, contextlib, sys
    from roles.infra import logs, process

    async def stubborn() -> None:
        while True:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(60)

    async def main(stop: asyncio.Event) -> None:
        logs.configure("test", "json")
        left = asyncio.create_task(stubborn(), name="stubborn-handler")
        print("ready", flush=True)
        await stop.wait()

    process.run_until_signalled(main, sys.argv[1])
    """
)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_task_that_swallows_its_cancellation_does_not_keep_a_stopped_role_alive(
    loop: str,
) -> None:
    code, records = _stopped(LEFT_BEHIND, loop)
    assert code == 0
    assert [(r.get("event"), r.get("tasks")) for r in records] == [
        ("role.tasks_left", ["stubborn-handler"])
    ]


async def test_closing_the_runtime_is_bounded(caplog: pytest.LogCaptureFixture) -> None:
    runtime = SimpleNamespace(close=_forever)
    started = time.monotonic()
    await Runtime.close_within(runtime, 0.2)  # type: ignore[arg-type]
    assert time.monotonic() - started < 3
    assert "role.close_stuck" in {getattr(r, "event", None) for r in caplog.records}


async def test_a_role_waits_for_a_database_that_refuses_its_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A role whose database refused its first connection (down a moment, out of connections:
    `too many clients`) exited at once; it tries again, logged, for up to its patience."""
    import psycopg

    monkeypatch.setattr(process, "DB_START_FIRST_WAIT_S", 0.01)
    tries: list[int] = []

    async def refused_twice() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise psycopg.OperationalError("FATAL:  sorry, too many clients already")
        return "migrated"

    assert await process.patiently(refused_twice, "migrate") == "migrated"
    waited = [r for r in caplog.records if getattr(r, "event", "") == "role.database_waiting"]
    assert len(tries) == 3 and len(waited) == 2

    async def always_refused() -> str:
        raise psycopg.OperationalError("connection refused")

    with pytest.raises(psycopg.OperationalError):  # past its patience: the role exits
        await process.patiently(always_refused, "migrate", patience_s=0.05)


def test_a_role_names_its_connections_unless_the_url_does() -> None:
    from psycopg.conninfo import conninfo_to_dict

    from roles.infra.db import named

    url = "postgresql://postgres@127.0.0.1:5432/receipt?sslmode=disable"
    assert conninfo_to_dict(named(url, "api")) == {
        **conninfo_to_dict(url),
        "application_name": "receipt-api",
    }
    own = "postgresql://postgres@db/receipt?application_name=ours"
    assert named(own, "driver") == own


def _runtime() -> Runtime:
    return Runtime("driver", None, None, "", None, None)  # type: ignore[arg-type]


async def test_a_background_task_that_dies_is_logged_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A role's task that ended with an error ended unseen: no line was logged and nothing
    counted (`close` gathers the tasks' errors and drops them), and what it did was not done
    again until the process restarted. The dispatcher's first rescan was such an error (the
    database away a moment at the role's start: tests/unit/test_dispatcher_failures.py); any
    loop's bug still is."""
    from receipts import metrics

    async def broken_loop() -> None:
        await asyncio.sleep(0)
        raise RuntimeError("a loop's bug")

    runtime = _runtime()
    before = metrics.value("receipt_role_tasks_failed_total", task="dispatcher")
    runtime.spawn(broken_loop(), "dispatcher")
    await asyncio.wait(runtime.tasks, timeout=5)
    await asyncio.sleep(0)  # the task's done callbacks
    assert runtime.tasks[0].done()
    assert metrics.value("receipt_role_tasks_failed_total", task="dispatcher") == before + 1
    failed = [r for r in caplog.records if getattr(r, "event", None) == "role.task_failed"]
    assert len(failed) == 1 and failed[0].levelname == "ERROR"
    assert getattr(failed[0], "task", None) == "dispatcher"


async def test_a_background_task_that_returns_or_is_cancelled_is_not_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from receipts import metrics

    async def once() -> None:
        return None

    runtime = _runtime()
    before = [metrics.value("receipt_role_tasks_failed_total", task=t) for t in ("once", "long")]
    runtime.spawn(once(), "once")
    runtime.spawn(_forever(), "long")
    await asyncio.sleep(0.01)
    runtime.tasks[1].cancel()
    await asyncio.gather(*runtime.tasks, return_exceptions=True)
    await asyncio.sleep(0)
    after = [metrics.value("receipt_role_tasks_failed_total", task=t) for t in ("once", "long")]
    assert after == before
    assert "role.task_failed" not in {getattr(r, "event", None) for r in caplog.records}


RESOLVES_BESIDE_HANDLER_THREADS = textwrap.dedent(
    """
    import asyncio, sys, threading
    from roles.infra import process

    gate = threading.Event()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        # What handlers' `asyncio.to_thread` calls left running (a blocking call without a
        # timeout, its handler cancelled): every thread of the default executor taken.
        held = [loop.run_in_executor(None, gate.wait) for _ in range(64)]
        try:
            await asyncio.wait_for(loop.getaddrinfo("localhost", 5432), 5)
            print("resolved", flush=True)
        except TimeoutError:
            print("held", flush=True)
        gate.set()
        await asyncio.gather(*held)

    process.run_event_loop(main(), sys.argv[1])
    """
)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_role_resolves_names_while_handlers_hold_every_default_thread(loop: str) -> None:
    """asyncio's loop (worker-codex's) looks names up on its default executor, the threads a
    handler's `asyncio.to_thread` takes: with those held (a cancelled handler's thread runs on),
    the worker's new PostgreSQL connections (psycopg resolves the host on the loop), its
    listener's reconnect and its gateway's requests waited behind them for good."""
    out = subprocess.run(
        [sys.executable, "-c", RESOLVES_BESIDE_HANDLER_THREADS, loop],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.stdout.strip() == "resolved", out.stderr


REPLACED = textwrap.dedent(
    """
    import asyncio, signal, sys
    from roles.infra import logs, process

    process.SIGNAL_CHECK_S = 0.05

    async def main(stop: asyncio.Event) -> None:
        logs.configure("test", "json")
        how = sys.argv[2]
        if how == "loop":  # a handler's own loop.add_signal_handler
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: None)
        elif how == "ignore":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        else:  # a library that traps SIGTERM to clean up
            signal.signal(signal.SIGTERM, lambda signum, frame: None)
        await asyncio.sleep(0.5)  # the check comes
        print("ready", flush=True)
        await stop.wait()
        print("drained", flush=True)

    process.run_until_signalled(main, sys.argv[1])
    """
)


@pytest.mark.parametrize("how", ["loop", "ignore", "trap"])
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_sigterm_handler_a_handler_installs_does_not_take_the_drain_s_place(
    loop: str, how: str
) -> None:
    """A handler's own SIGTERM handler replaced the drain's: at a rollout the worker took new
    work on until the pod's grace killed it. It is put back within `SIGNAL_CHECK_S`."""
    with subprocess.Popen(
        [sys.executable, "-c", REPLACED, loop, how],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as child:
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            child.send_signal(signal.SIGTERM)
            stdout, stderr = child.communicate(timeout=10)
        finally:
            if child.poll() is None:
                child.kill()
    assert (child.returncode, stdout.strip()) == (0, "drained"), stderr
    records = [json.loads(line) for line in stderr.splitlines() if line]
    assert [(r.get("event"), r.get("signal")) for r in records] == [
        ("role.signal_handler_restored", "SIGTERM")
    ]


HELD_LOOP = textwrap.dedent(
    """
    import asyncio, sys, time
    from roles.infra import logs, process

    async def main(stop: asyncio.Event) -> None:
        logs.configure("test", "json")
        print("ready", flush=True)
        if sys.argv[2] == "drain":
            await stop.wait()
            print("draining", flush=True)
        # A drain held by a blocking call on the event loop (a handler's `time.sleep`, a
        # CPU-bound step: `loop.stalled`), which is when a second Ctrl-C is pressed.
        time.sleep(20)

    process.run_until_signalled(main, sys.argv[1])
    """
)


@pytest.mark.parametrize("when", ["drain", "stalled"])
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_second_ctrl_c_exits_at_once_while_a_blocking_call_holds_the_loop(
    loop: str, when: str
) -> None:
    """A second Ctrl-C exits at once (130, `role.forced_exit`) even while the event loop is
    held by a blocking call: the drain's SIGINT handler runs between two bytecodes, but the exit
    it asked the loop for waited for that call to return (20 s here), the force quit forcing
    nothing. `drain`: the first Ctrl-C's drain began, then the loop was held; `stalled`: both
    came while it was held."""
    with subprocess.Popen(
        [sys.executable, "-c", HELD_LOOP, loop, when],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as child:
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            time.sleep(0.3)
            child.send_signal(signal.SIGINT)
            if when == "drain":
                assert child.stdout.readline().strip() == "draining"
            time.sleep(0.3)
            sent = time.monotonic()
            child.send_signal(signal.SIGINT)
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            exited_s = time.monotonic() - sent
        finally:
            if child.poll() is None:
                child.kill()
            _, stderr = child.communicate()
    assert child.returncode == process.EXIT_FORCED and exited_s < 5, (exited_s, stderr)
    events = [json.loads(line).get("event") for line in stderr.splitlines() if line]
    assert "role.forced_exit" in events, stderr


DRAINING = textwrap.dedent(
    """
    import asyncio, signal, sys
    from receipts import metrics
    from roles.infra import logs, process

    process.SIGNAL_CHECK_S = 0.05

    async def main(stop: asyncio.Event) -> None:
        logs.configure("test", "json")
        if sys.argv[2] == "replace-sigint":  # a library that traps Ctrl-C
            signal.signal(signal.SIGINT, lambda signum, frame: None)
            await asyncio.sleep(0.5)  # the check comes
        print("ready", flush=True)
        await stop.wait()
        restored = [
            metrics.value("receipt_signal_handlers_restored_total", signal=name)
            for name in ("SIGTERM", "SIGINT")
        ]
        print("draining", *restored, flush=True)
        await asyncio.sleep(float(sys.argv[3]))  # the drain
        print("drained", flush=True)

    process.run_until_signalled(main, sys.argv[1])
    """
)


def _draining(loop: str, how: str, drain_s: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", DRAINING, loop, how, str(drain_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_sigint_handler_a_handler_installs_is_put_back_and_counted(loop: str) -> None:
    """SIGINT is a drain signal as SIGTERM is (a Ctrl-C on `receipt up`): one a handler
    replaced is put back, counted under its name, and a Ctrl-C drains the role."""
    with _draining(loop, "replace-sigint", 0.0) as child:
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            child.send_signal(signal.SIGINT)
            stdout, stderr = child.communicate(timeout=10)
        finally:
            if child.poll() is None:
                child.kill()
    assert (child.returncode, stdout.split()) == (0, ["draining", "0.0", "1.0", "drained"]), stderr
    records = [json.loads(line) for line in stderr.splitlines() if line]
    assert [(r.get("event"), r.get("signal")) for r in records] == [
        ("role.signal_handler_restored", "SIGINT")
    ]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("first", [signal.SIGINT, signal.SIGTERM])
def test_a_ctrl_c_during_the_drain_exits_at_once_and_a_sigterm_does_not(
    loop: str, first: signal.Signals
) -> None:
    """The first SIGINT or SIGTERM begins the drain (here 20 s); a SIGINT then (a second
    Ctrl-C) exits at once, 130, logged `role.forced_exit`; a SIGTERM then (a supervisor's
    repeat) changes nothing: the drain goes on to its end."""
    with _draining(loop, "", 20.0) as child:
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            child.send_signal(first)
            assert child.stdout.readline().split()[0] == "draining"
            child.send_signal(signal.SIGTERM)
            with pytest.raises(subprocess.TimeoutExpired):
                child.wait(timeout=1.0)
            child.send_signal(signal.SIGINT)
            again = time.monotonic()
            stdout, stderr = child.communicate(timeout=10)
            exited_s = time.monotonic() - again
        finally:
            if child.poll() is None:
                child.kill()
    assert (child.returncode, stdout.strip()) == (130, ""), stderr
    assert exited_s < 3.0
    records = [json.loads(line) for line in stderr.splitlines() if line]
    assert [r.get("event") for r in records] == ["role.forced_exit"]
