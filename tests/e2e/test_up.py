"""`receipt up`'s stop, with the real `up` and its five role processes (on the session's
PostgreSQL and Temporal): Ctrl-C gives each role its own shutdown's whole bound before SIGKILL,
and a second Ctrl-C stops everything at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from receipts.store import Store
from roles.infra.ports import free_port
from roles.infra.supervisor import Supervised
from tests.e2e.roles_harness import wait_for
from tests.eventually import eventually
from tests.integration.helpers import put

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]

# A handler that swallows its cancellation and runs on: a worker's drain then ends only when
# the attempt abandons it (activities/attempt.py HANDLER_CANCEL_S, 5 s after the grace) and
# writes its release.
STUBBORN = """
import asyncio

from receipt_worker import JobContext, handler


@handler("stubborn")
async def stubborn(job: JobContext) -> dict:
    await job.progress({"started": True})
    try:
        await asyncio.sleep(600)
    except asyncio.CancelledError:
        pass  # its cleanup takes its time
    await asyncio.sleep(600)
    return {}
"""


def install_stubborn(site: Path) -> None:
    """Install the `stubborn` agent's handler (an entry point) under `site`."""
    dist = site / "stubborn_bot-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: stubborn-bot\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[receipt.handlers]\nstubborn = stubborn_bot:stubborn\n")
    (site / "stubborn_bot.py").write_text(STUBBORN)


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, exited but not reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class Up:
    """One `receipt up` process, its output in a file."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        self.process = Supervised("up", [sys.executable, "-m", "roles.cli.main", "up"], env)
        self.process.log_file = log
        self.process.cwd = ROOT
        self.process.start()
        self.roles: list[int] = []

    def lines(self) -> list[tuple[str, str]]:
        """`(name, line)` of every prefixed line `up` wrote (its own and its roles')."""
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            name, bar, text = line.partition(" | ")
            if bar:
                found.append((name.strip(), text))
        return found

    def logged(self, name: str, event: str) -> list[dict[str, Any]]:
        """The JSON log records of role `name` whose `event` is `event`."""
        found = []
        for who, text in self.lines():
            if who == name and text.startswith("{"):
                with contextlib.suppress(ValueError):
                    record = json.loads(text)
                    if record.get("event") == event:
                        found.append(record)
        return found

    def said(self, start: str) -> bool:
        return any(name == "up" and text.startswith(start) for name, text in self.lines())

    async def exit_status(self, timeout: float) -> int:
        async def polled() -> int | None:
            return self.process.returncode()

        status = await eventually(
            polled, lambda rc: rc is not None, timeout=timeout, every=0.05, what="up exiting"
        )
        assert status is not None
        return status

    def stop(self) -> None:
        """Whatever is left: `up` and its roles, SIGKILLed."""
        for pid in [*self.roles, *children(self.process.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.kill()


@pytest.fixture
def up_stack(
    e2e_store: tuple[Store, str], temporal_env: Any, tmp_path: Path
) -> Iterator[Callable[..., Up]]:
    """`up_stack(**env)` → `receipt up` on the test database and Temporal, with the `stubborn`
    agent installed, every role's log as JSON."""
    site = tmp_path / "site"
    install_stubborn(site)
    started: list[Up] = []

    def make(**extra: str) -> Up:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("RECEIPT_", "PYTEST", "JOB_LEASE", "CODEX_", "FACTORY_"))
        }
        if "RECEIPT_WORKSPACE_ROOT" in os.environ:  # the session's (tests/conftest.py)
            env["RECEIPT_WORKSPACE_ROOT"] = os.environ["RECEIPT_WORKSPACE_ROOT"]
        paths = [str(site), *filter(None, os.environ.get("PYTHONPATH", "").split(":"))]
        env.update(
            RECEIPT_DATABASE_URL=e2e_store[1],
            RECEIPT_TEMPORAL_ADDRESS=temporal_env.client.service_client.config.target_host,
            RECEIPT_TASK_QUEUE_PREFIX=f"u{uuid.uuid4().hex[:8]}-",
            RECEIPT_API_PORT=str(free_port()),
            RECEIPT_METRICS_PORT="0",
            RECEIPT_DATA_DIR=str(tmp_path / "data"),
            PYTHONPATH=":".join(paths),
            **extra,
        )
        up = Up(env, tmp_path / f"up-{len(started)}.log")
        started.append(up)
        return up

    yield make
    for up in started:
        up.stop()


async def a_stubborn_job_running(store: Store, up: Up) -> str:
    """Enqueue a `stubborn` job and wait until its handler runs (in `up`'s worker-chat)."""
    job = (await put(store, agent="stubborn", maxAttempts=1)).job
    await wait_for(store, job.job_id, ("running",), 120)

    async def progressed() -> list[str]:
        return [r.type for r in await store.read_stream(f"jobs/{job.job_id}")]

    await eventually(progressed, lambda t: "job.progress" in t, timeout=30, what="the handler")
    up.roles = children(up.process.pid)
    return job.job_id


async def test_ctrl_c_gives_each_role_its_own_shutdown_s_bound_before_sigkill(
    e2e_store: tuple[Store, str], up_stack: Callable[..., Up]
) -> None:
    """`up` SIGKILLed each role 5 s past the grace, while a role's own shutdown is bounded at
    the grace, 10 s more for a stuck drain, and its exit's 12 s: a handler that swallows its
    cancellation is abandoned 5 s after the grace, and worker-chat was killed as it wrote the
    job's release (never logging `role.stop`; the job waited for its lease to lapse). Now `up`
    waits out the roles' own bound: the release is written and every role stops by itself."""
    store, _ = e2e_store
    up = up_stack(RECEIPT_SHUTDOWN_GRACE_MS="1000")
    try:
        job_id = await a_stubborn_job_running(store, up)
        up.process.send(signal.SIGINT)
        stopped = time.monotonic()
        status = await up.exit_status(90)
        stopped_s = time.monotonic() - stopped
    except BaseException:
        print(up.log.read_text(errors="replace")[-20_000:])
        raise
    print(f"up stopped in {stopped_s:.1f} s, status {status}")
    receipts = await store.read_stream(f"jobs/{job_id}")
    released = [r for r in receipts if r.type == "job.failed"]
    assert status == 0
    assert up.logged("worker-chat", "attempt.handler_abandoned")
    assert up.logged("worker-chat", "role.stop")  # stopped by itself, not SIGKILLed
    assert [r.data.get("refundAttempt") for r in released] == [True]
    assert not [pid for pid in up.roles if alive(pid)]


async def test_a_second_ctrl_c_stops_every_role_at_once(
    e2e_store: tuple[Store, str], up_stack: Callable[..., Up]
) -> None:
    """A second Ctrl-C did nothing: `up` waited for every role's drain (here a handler that
    swallows its cancellation: the grace and 5 s), while the api's uvicorn says "(CTRL+C to
    force quit)". Now it SIGKILLs what still runs and exits at once (130); the jobs the roles
    held are delivered again from the receipts."""
    store, _ = e2e_store
    up = up_stack(RECEIPT_SHUTDOWN_GRACE_MS="10000")
    try:
        await a_stubborn_job_running(store, up)
        up.process.send(signal.SIGINT)

        async def stopping() -> bool:
            return up.said("stopping:")

        await eventually(stopping, bool, timeout=10, every=0.05, what="up stopping")
        await asyncio.sleep(0.5)
        up.process.send(signal.SIGINT)
        again = time.monotonic()
        status = await up.exit_status(60)
        exited_s = time.monotonic() - again
    except BaseException:
        print(up.log.read_text(errors="replace")[-20_000:])
        raise
    print(f"up exited {exited_s:.1f} s after the second Ctrl-C, status {status}")
    assert exited_s < 5.0  # not the grace and 5 s of the stubborn handler's drain
    assert status == 130
    assert up.said("Ctrl-C again: SIGKILL")
    assert not [pid for pid in up.roles if alive(pid)]
