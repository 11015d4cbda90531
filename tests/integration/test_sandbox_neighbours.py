"""One job's command against the jobs beside it on the same worker, with real bubblewrap and
real processes: what it takes of the workspace volume and CPU that they need."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.sandbox import (
    SandboxNotStarted,
    SandboxResult,
    SandboxSettings,
    probe,
    run_sandboxed,
)
from activities.workspaces import job_workspace
from receipts import metrics


@pytest.fixture
def volume() -> Iterator[Path]:
    """A volume of its own: 96 MiB, 100 000 inodes (a tmpfs this test mounts; skipped where it
    cannot)."""
    top = Path(tempfile.mkdtemp(prefix="receipt-volume-"))
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=96m,nr_inodes=100000", "tmpfs", str(top)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        top.rmdir()
        pytest.skip("a small volume cannot be mounted here (the test needs root)")
    try:
        yield top
    finally:
        subprocess.run(["umount", "-l", str(top)], check=False)
        top.rmdir()


@pytest.fixture
async def small_volume(volume: Path) -> SandboxSettings:
    """Sandbox settings whose workspace root is on `volume`, each workspace bounded at 16 MiB
    and 500 files (skipped where bwrap cannot run)."""
    base = SandboxSettings.load(os.environ)
    settings = SandboxSettings(
        **{
            **base.model_dump(),
            "workspace_root": str(volume / "workspaces"),
            "file_size_mb": 8,
            "workspace_mb": 16,
            "workspace_files": 500,
        }
    )
    ok, message = await probe(settings)
    if not ok:
        pytest.skip(f"SANDBOX TESTS NOT RUN: {message}")
    return settings


def workspace(settings: SandboxSettings, organization: str) -> Path:
    return job_workspace(organization, f"job-{uuid.uuid4().hex[:12]}", settings)


async def quiet(text: str) -> None:
    pass


async def run(argv: list[str], settings: SandboxSettings, where: Path) -> SandboxResult:
    return await asyncio.wait_for(
        run_sandboxed(argv, workspace=where, settings=settings, on_output=quiet), 60
    )


# Files each under the file-size limit (1 MiB, 20 a second), and empty files (10 000 a second),
# without end. Paced: the bound is checked about once a second, and what a command writes in
# between passes it (unpaced, a shell makes 100 000 empty files a second on this tmpfs).
FILL_BYTES = "i=0; while head -c 1048576 /dev/zero > f$i; do i=$((i+1)); sleep 0.05; done"
FILL_FILES = "i=0; while : > e$i; do i=$((i+1)); [ $((i % 100)) -ne 0 ] || sleep 0.01; done"


@pytest.mark.parametrize("fill", [FILL_BYTES, FILL_FILES], ids=["bytes", "files"])
async def test_a_command_filling_the_workspace_volume_is_killed_before_its_neighbours_fail(
    small_volume: SandboxSettings, fill: str
) -> None:
    # Without the bound the filler took the whole volume (96 MiB of 1 MiB files; or its 100 000
    # inodes): another organization's command then failed its write (ENOSPC), and the next
    # job could not make its workspace (refused, never retried).
    settings = small_volume
    neighbour = workspace(settings, "org-b")
    assert (await run(["true"], settings, neighbour)).exit_code == 0
    kills = metrics.SANDBOX_DISK_KILLS._value.get()
    filler = await run(["sh", "-c", fill], settings, workspace(settings, "org-a"))
    assert filler.disk_limit and filler.exit_code != 0
    assert metrics.SANDBOX_DISK_KILLS._value.get() == kills + 1
    write = "head -c 4194304 /dev/zero > out && for i in $(seq 100); do : > n$i; done"
    assert (await run(["sh", "-c", write], settings, neighbour)).exit_code == 0
    assert (neighbour / "out").stat().st_size == 4 * 1024 * 1024
    assert (await run(["true"], settings, workspace(settings, "org-c"))).exit_code == 0


async def test_a_job_that_finds_the_volume_full_may_be_retried(
    small_volume: SandboxSettings,
) -> None:
    # The volume is full (here its inodes, taken on the host): a new job's workspace cannot be
    # made. That was SandboxRefused, which fails the job for good (never retried), though the
    # job is not at fault and the next try may find room.
    settings = small_volume
    assert (await run(["true"], settings, workspace(settings, "org-b"))).exit_code == 0
    taken = settings.workspace_root / "taken"
    taken.mkdir()
    with pytest.raises(OSError):
        for i in range(200_000):
            (taken / str(i)).touch()
    with pytest.raises(SandboxNotStarted, match="volume is full"):
        await run(["true"], settings, workspace(settings, "org-c"))


async def test_a_worker_that_starts_on_a_full_volume_refuses_no_job_for_good(
    volume: Path,
) -> None:
    # The first command of a worker probes the sandbox in a workspace of its own: on a full
    # volume that probe failed, was kept 30 s as "bubblewrap cannot confine", and every command
    # meanwhile was SandboxRefused (its job failed for good), though nothing was wrong with
    # bubblewrap and the next try may find room.
    settings = SandboxSettings(
        **{**SandboxSettings.load(os.environ).model_dump(), "workspace_root": str(volume / "w")}
    )
    (volume / "w").mkdir()
    taken = volume / "taken"
    taken.mkdir()
    with pytest.raises(OSError):
        for i in range(200_000):
            (taken / str(i)).touch()
    with pytest.raises(SandboxNotStarted, match="volume is full"):
        await run(["true"], settings, workspace(settings, "org-a"))
    await asyncio.to_thread(shutil.rmtree, taken)
    ok, message = await probe(settings)
    if not ok:
        pytest.skip(f"SANDBOX TESTS NOT RUN: {message}")
    assert (await run(["true"], settings, workspace(settings, "org-a"))).exit_code == 0
