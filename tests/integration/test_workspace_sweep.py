"""Workspace retention (RECEIPT_WORKSPACE_RETENTION): a workspace nothing has used for the
retention whose owner is no longer active is removed; one in use, or whose owner is active
however long it has been quiet, is kept. Workspaces were kept for ever: a worker's volume filled
with every standalone task's and settled objective's files until the kubelet evicted the pod."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import time
from datetime import timedelta
from pathlib import Path

from activities.sandbox_policy import SandboxSettings
from activities.workspace_sweep import WorkspaceSweeper
from activities.workspaces import (
    agent_job_workspace,
    job_workspace,
    objective_workspace,
    prepare_workspace,
    used_marker,
)
from receipts import metrics
from receipts import operations as ops
from receipts.agent_jobs import lifecycle
from receipts.store import Store
from tests.integration.helpers import create_objective, put
from tests.integration.test_agent_jobs import request

DAY = 86_400


def made(path: Path, days_idle: float) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "output.txt").write_text("kept until removed")
    then = time.time() - days_idle * DAY
    os.utime(path, (then, then))
    return path


async def test_idle_workspaces_of_owners_no_longer_active_are_removed(
    fresh: tuple[Store, str], tmp_path: Path
) -> None:
    store, _ = fresh
    settings = SandboxSettings(workspace_root=tmp_path, mode="none")
    running = (await put(store, org="org-a")).job  # queued: active
    settled = (await put(store, org="org-a")).job
    await ops.cancel_queued(store, settled.job_id, reason="done")
    recent = (await put(store, org="org-a")).job
    await ops.cancel_queued(store, recent.job_id, reason="done")
    await create_objective(store, "live-objective", org="org-a")  # active
    waiting, _ = await lifecycle.create(store, request("agent-sweep"))  # queued: unfinished
    # A task naming an objective that is not active (settled, or never created) works in its
    # workspace all the same while it runs.
    await put(store, org="org-a", payload_extra={"objectiveId": "settled-objective"})

    keep = [
        made(job_workspace("org-a", running.job_id, settings), 30),
        made(job_workspace("org-a", recent.job_id, settings), 1),  # used within the retention
        made(objective_workspace("org-a", "live-objective", settings), 30),
        made(agent_job_workspace("org-a", waiting.workspace_owner_job_id, settings), 30),
        made(objective_workspace("org-a", "settled-objective", settings), 30),
    ]
    gone = [
        made(job_workspace("org-a", settled.job_id, settings), 30),
        made(objective_workspace("org-b", "long-gone", settings), 30),  # no such owner now
        made(tmp_path / "orgs" / "org-a" / "jobs" / ".x.removing-0123abcd", 0),  # interrupted
    ]
    removed = metrics.value("receipt_workspaces_removed_total", reason="idle")
    sweeper = WorkspaceSweeper(store, settings, timedelta(days=7))
    assert await sweeper.run_once() == 3
    assert [p.exists() for p in keep] == [True] * 5
    assert [p.exists() for p in gone] == [False] * 3
    assert metrics.value("receipt_workspaces_removed_total", reason="idle") == removed + 2
    assert await sweeper.run_once() == 0

    # A command starting in a workspace marks it used: the sweep keeps it from then on.
    reused = made(job_workspace("org-a", "reused", settings), 30)
    prepare_workspace(reused, settings)
    assert await sweeper.run_once() == 0 and reused.exists()


def test_the_retention_is_a_duration_and_zero_keeps_them() -> None:
    import pytest

    from receipts.settings import SettingsError

    assert SandboxSettings.load({}).workspace_retention == "0"
    assert SandboxSettings.load({"RECEIPT_WORKSPACE_RETENTION": "7d"}).workspace_retention == "7d"
    with pytest.raises(SettingsError, match="RECEIPT_WORKSPACE_RETENTION"):
        SandboxSettings.load({"RECEIPT_WORKSPACE_RETENTION": "a week"})


async def test_a_command_cannot_keep_its_idle_workspace_from_the_sweep(
    fresh: tuple[Store, str], tmp_path: Path
) -> None:
    """The sweep read the workspace's own modification time, which its command sets (`touch -d
    2099-01-01 .`): an idle workspace of a settled job was kept for good. It reads the marker
    beside it, which no command reaches, and removes the marker with it."""
    store, _ = fresh
    settings = SandboxSettings(workspace_root=tmp_path, mode="none")
    settled = (await put(store, org="org-a")).job
    await ops.cancel_queued(store, settled.job_id, reason="done")
    workspace = job_workspace("org-a", settled.job_id, settings)
    prepare_workspace(workspace, settings)  # a command started in it
    marker = used_marker(workspace)
    long_ago = time.time() - 30 * DAY
    os.utime(marker, (long_ago, long_ago))  # ... 30 days ago
    future = time.time() + 3650 * DAY
    os.utime(workspace, (future, future))  # what the command set its directory's time to
    sweeper = WorkspaceSweeper(store, settings, timedelta(days=7))
    assert await sweeper.run_once() == 1
    assert not workspace.exists() and not marker.exists()


def nest(top: Path, depth: int) -> Path:
    """`d/d/…/d` `depth` deep under `top` (through descriptors: its path may be longer than any
    path the system takes), what `mkdir d; cd d` in a loop leaves; returns the first `d`."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = deeper
        os.mkdir("locked", mode=0o000, dir_fd=fd)  # `chmod 000` at the bottom
    finally:
        os.close(fd)
    return top / "d"


def rm_rf(path: Path) -> None:
    subprocess.run(["chmod", "-R", "u+rwx", str(path)], check=False)
    subprocess.run(["rm", "-rf", str(path)], check=False)


async def test_a_workspace_nested_thousands_deep_is_removed_and_its_links_not_followed(
    fresh: tuple[Store, str], tmp_path: Path
) -> None:
    """The sweep walked a workspace with Python's recursive walks: a command that nested
    directories a few thousand deep made its workspace undeletable (RecursionError out of every
    pass, its files kept for good)."""
    store, _ = fresh
    settings = SandboxSettings(workspace_root=tmp_path / "root", mode="none")
    settled = (await put(store, org="org-a")).job
    await ops.cancel_queued(store, settled.job_id, reason="done")
    workspace = job_workspace("org-a", settled.job_id, settings)
    prepare_workspace(workspace, settings)
    try:
        nest(workspace, 1500)
        host = tmp_path / "host"
        host.mkdir(mode=0o711)
        (host / "file").write_text("the host's")
        (workspace / "to-host").symlink_to(host)  # a link to a host directory, never followed
        long_ago = time.time() - 30 * DAY
        os.utime(used_marker(workspace), (long_ago, long_ago))
        sweeper = WorkspaceSweeper(store, settings, timedelta(days=7))
        assert await sweeper.run_once() == 1
        assert os.listdir(workspace.parent) == []  # the workspace, its marker, no leftover
        assert (host / "file").read_text() == "the host's"
        assert stat.S_IMODE(host.stat().st_mode) == 0o711
    finally:  # what is left would break pytest's own clean-up of its temporary directories
        await asyncio.to_thread(rm_rf, settings.workspace_root)
