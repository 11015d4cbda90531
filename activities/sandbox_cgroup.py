"""A cgroup per sandbox, where the worker may create one: memory and processes bounded for the
whole sandbox, not per process (the rlimits stay as the floor everywhere).

`RECEIPT_SANDBOX_CGROUP` decides:

- `auto` (default): cgroup v2 when the worker's own cgroup has `memory` and `pids` enabled for
  its children (`cgroup.subtree_control`; run the worker in a delegated sub-cgroup for that),
  else the cgroup v1 `memory` and `pids` hierarchies when the worker may write them (a root
  worker on a v1 host), else none: rlimits only, said once at start.
- `off`: rlimits only.
- an absolute path: a cgroup v2 directory an operator delegated (`memory` and `pids` in its
  `cgroup.subtree_control`); a worker that cannot use it refuses to start commands.

Each sandbox gets `receipt-<hex>` under each parent with the memory limit
(`RECEIPT_SANDBOX_MEMORY_MB`, swap off) and the process limit (`RECEIPT_SANDBOX_PROCESSES`). The
command joins it before anything of it runs: the command line starts with a shell that writes
its own pid into each `cgroup.procs` and execs the rest, so every descendant is born inside.
When the sandbox ends, whatever is left in the cgroup is killed and the cgroup removed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from receipts import metrics

CGROUP_SETTING = "RECEIPT_SANDBOX_CGROUP"
CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids")
# `sh -c` with the procs files, then `--`, then the command: join every cgroup, then exec.
JOIN_SCRIPT = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
KILL_ROUNDS = 50

log = logging.getLogger("activities.sandbox")
_plans: dict[str, CgroupPlan | None] = {}


@dataclass(frozen=True)
class CgroupPlan:
    """Where sandbox cgroups are made: v2, one parent with both controllers; v1, one parent per
    controller (memory first, then pids)."""

    version: int
    parents: tuple[Path, ...]

    def describe(self) -> str:
        return f"cgroup v{self.version} under {', '.join(str(p) for p in self.parents)}"


class CgroupUnavailable(Exception):
    """`RECEIPT_SANDBOX_CGROUP` names a cgroup this worker cannot use; the message says why."""


def own_cgroups(proc_cgroup: str) -> dict[str, str]:
    """The worker's cgroup paths by controller from `/proc/self/cgroup` (`""` for v2)."""
    paths: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _v2_usable(directory: Path) -> bool:
    try:
        enabled = (directory / "cgroup.subtree_control").read_text().split()
    except OSError:
        return False
    return all(c in enabled for c in CONTROLLERS) and os.access(directory, os.W_OK)


def find_plan(
    setting: str, root: Path = CGROUP_ROOT, proc_cgroup: str | None = None
) -> CgroupPlan | None:
    """The plan `setting` asks for on this host (None: rlimits only). Raises CgroupUnavailable
    for an explicit path that cannot be used, and ValueError for a setting that is not one."""
    setting = setting.strip() or "auto"
    if setting == "off":
        return None
    if setting != "auto":
        directory = Path(setting)
        if not directory.is_absolute():
            raise ValueError(
                f"{CGROUP_SETTING} must be auto, off or an absolute path, got {setting!r}"
            )
        if not _v2_usable(directory):
            raise CgroupUnavailable(
                f"{CGROUP_SETTING}={setting}: not a writable cgroup v2 directory with "
                f"{' and '.join(CONTROLLERS)} in its cgroup.subtree_control"
            )
        return CgroupPlan(2, (directory,))
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
    own = own_cgroups(proc_cgroup)
    if "" in own and (root / "cgroup.controllers").exists():
        directory = root / own[""].lstrip("/")
        if _v2_usable(directory):
            return CgroupPlan(2, (directory,))
    v1 = [root / c / own[c].lstrip("/") for c in CONTROLLERS if c in own]
    if len(v1) == len(CONTROLLERS) and all(
        (p / "cgroup.procs").exists() and os.access(p, os.W_OK) for p in v1
    ):
        return CgroupPlan(1, tuple(v1))
    return None


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _read_count(path: Path, key: str) -> int:
    """A `key N` line of a flat-keyed cgroup file (memory.events, memory.oom_control)."""
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return 0


class SandboxCgroup:
    """One sandbox's cgroup (one directory per parent of the plan)."""

    def __init__(self, plan: CgroupPlan, directories: tuple[Path, ...]) -> None:
        self.plan = plan
        self.directories = directories

    @classmethod
    def create(cls, plan: CgroupPlan, *, memory_mb: int, processes: int) -> SandboxCgroup:
        """Make the cgroup and set its limits; OSError if the host refuses (nothing is left)."""
        name = f"receipt-{uuid.uuid4().hex[:16]}"
        made: list[Path] = []
        cgroup = cls(plan, tuple(p / name for p in plan.parents))
        try:
            for directory in cgroup.directories:
                directory.mkdir()
                made.append(directory)
            cgroup._limit(memory_mb * 1024 * 1024, processes)
        except OSError:
            for directory in reversed(made):
                with contextlib.suppress(OSError):
                    directory.rmdir()
            raise
        return cgroup

    def _limit(self, memory_bytes: int, processes: int) -> None:
        if self.plan.version == 2:
            (directory,) = self.directories
            _write(directory / "memory.max", str(memory_bytes))
            with contextlib.suppress(FileNotFoundError):
                _write(directory / "memory.swap.max", "0")
            _write(directory / "pids.max", str(processes))
            return
        memory, pids = self.directories
        _write(memory / "memory.limit_in_bytes", str(memory_bytes))
        with contextlib.suppress(FileNotFoundError):
            # memory + swap no more than memory: swap cannot stretch the limit.
            _write(memory / "memory.memsw.limit_in_bytes", str(memory_bytes))
        _write(pids / "pids.max", str(processes))

    def join_prefix(self) -> list[str]:
        """The argv that puts the command into this cgroup before it runs (then execs it)."""
        procs = [str(d / "cgroup.procs") for d in self.directories]
        return ["/bin/sh", "-c", JOIN_SCRIPT, "receipt-cgroup-join", *procs, "--"]

    def memory_killed(self) -> bool:
        """Whether the kernel killed a process of this sandbox for its memory limit."""
        memory = self.directories[0]
        if self.plan.version == 2:
            return _read_count(memory / "memory.events", "oom_kill") > 0
        return _read_count(memory / "memory.oom_control", "oom_kill") > 0

    def pids(self) -> set[int]:
        found: set[int] = set()
        for directory in self.directories:
            with contextlib.suppress(OSError, ValueError):
                found.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
        return found

    def kill_all(self) -> None:
        """Kill whatever is left inside (blocking; nothing to do, and no wait, when it is empty)."""
        kill_file = self.directories[0] / "cgroup.kill"
        if self.plan.version == 2 and kill_file.exists():
            with contextlib.suppress(OSError):
                _write(kill_file, "1")
        for _ in range(KILL_ROUNDS):
            left = self.pids()
            if not left:
                return
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self) -> None:
        """Remove the emptied cgroup (blocking: the kernel may keep it busy for a few ms after
        its last process exits, so this retries)."""
        for directory in reversed(self.directories):
            for _ in range(KILL_ROUNDS):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)
        if any(d.exists() for d in self.directories):
            metrics.SANDBOX_CGROUPS_LEFT.inc()
            log.warning(
                "a sandbox cgroup could not be removed",
                extra={"event": "sandbox.cgroup_left", "cgroup": str(self.directories[0])},
            )

    def close(self) -> None:
        """Kill whatever is left inside, then remove the cgroup."""
        self.kill_all()
        self.remove()


def plan_for(setting: str) -> CgroupPlan | None:
    """Where this worker makes sandbox cgroups, found once per setting (a trial cgroup is made
    and removed). `auto` on a host that lists cgroups it then cannot create in falls back to
    rlimits, with a warning; an explicit path raises CgroupUnavailable."""
    if setting in _plans:
        return _plans[setting]
    plan = find_plan(setting)
    if plan is not None:
        try:
            SandboxCgroup.create(plan, memory_mb=1, processes=1).close()
        except OSError as exc:
            if setting != "auto":
                raise CgroupUnavailable(f"{CGROUP_SETTING}={setting}: {exc}") from exc
            log.warning(
                "sandbox cgroups are listed but cannot be created here (%s); rlimits only",
                exc,
                extra={"event": "sandbox.cgroup_unavailable", "error": str(exc)},
            )
            plan = None
    _plans[setting] = plan
    return plan
