"""Workspaces: where a job's commands run, one tree per organization (docs/design.md §9).

    <root>/orgs/<organization>/objectives/<objectiveId>   an objective's tasks, validate, publish
    <root>/orgs/<organization>/jobs/<jobId>               a standalone task (no objective)
    <root>/orgs/<organization>/agent-jobs/<ownerJobId>    an agent job and the jobs continuing it

`<root>` is `RECEIPT_WORKSPACE_ROOT`. The organization is the job's own (from its authContext,
checked against the caller's token by the API), never an id the payload names, and the ids
below it are the organization's own (`receipts/tenancy.py`: the runtime's tag dropped), so no
id a job can send reaches another organization's tree. Every directory on the way is
traversable but not listable by the sandbox's uids (0711), a workspace itself is 0700 and owned
by its own uid, and the sandbox binds only the job's workspace: a command sees nothing else.

Workspaces of an earlier layout (`<root>/<objectiveId>`, `<root>/.jobs/<jobId>`,
`<root>/.agent-jobs/<ownerJobId>`) are moved into place the first time their owner runs again
(`adopt`), once the caller has checked that the owner is the job's organization.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
from pathlib import Path

from activities.sandbox_policy import (
    DEFAULT_PATH,
    SAFE_NAME,
    SandboxRefused,
    SandboxSettings,
    searchable_by_others,
)
from receipts.tenancy import caller_id

log = logging.getLogger("activities.workspaces")

ORGANIZATIONS_DIR = "orgs"
OBJECTIVES_DIR = "objectives"
JOBS_DIR = "jobs"
AGENT_JOBS_DIR = "agent-jobs"
DIRECTORY_MODE = 0o711  # traversable, not listable, by the sandbox's uids


def workspace_name(identifier: str) -> str:
    """A directory name for an id: the id itself when it is a safe name, else a digest."""
    if SAFE_NAME.fullmatch(identifier) and identifier not in (".", ".."):
        return identifier
    return "%" + hashlib.sha256(identifier.encode()).hexdigest()[:40]


def organization_root(organization_id: str | None, settings: SandboxSettings) -> Path:
    """`<root>/orgs/<organization>`: every workspace of one organization is below it."""
    if not organization_id:
        raise SandboxRefused("a job without an organization runs no command (no workspace)")
    return settings.workspace_root / ORGANIZATIONS_DIR / workspace_name(organization_id)


def objective_workspace(
    organization_id: str | None, objective_id: str, settings: SandboxSettings
) -> Path:
    """An objective's workspace, shared by its tasks, validate and publish."""
    return (
        organization_root(organization_id, settings)
        / OBJECTIVES_DIR
        / workspace_name(caller_id(objective_id))
    )


def job_workspace(organization_id: str | None, job_id: str, settings: SandboxSettings) -> Path:
    """A standalone job's workspace (kept after the job)."""
    return (
        organization_root(organization_id, settings) / JOBS_DIR / workspace_name(caller_id(job_id))
    )


def agent_job_workspace(
    organization_id: str | None, owner_job_id: str, settings: SandboxSettings
) -> Path:
    """An agent job's workspace: its own, or that of the job it continues (its owner)."""
    return (
        organization_root(organization_id, settings) / AGENT_JOBS_DIR / workspace_name(owner_job_id)
    )


def legacy_objective_workspace(objective_id: str, settings: SandboxSettings) -> Path:
    """Where the earlier layout kept an objective's workspace: `<root>/<objectiveId>`."""
    return settings.workspace_root / workspace_name(objective_id)


def legacy_job_workspace(job_id: str, settings: SandboxSettings) -> Path:
    """Where the earlier layout kept a standalone job's workspace: `<root>/.jobs/<jobId>`."""
    return settings.workspace_root / ".jobs" / workspace_name(job_id)


def legacy_agent_job_workspace(owner_job_id: str, settings: SandboxSettings) -> Path:
    """Where the earlier layout kept an agent job's workspace: `<root>/.agent-jobs/<owner>`."""
    return settings.workspace_root / ".agent-jobs" / workspace_name(owner_job_id)


def uid_for(workspace: Path, settings: SandboxSettings) -> int:
    """The host uid a root worker runs a workspace's commands as: one per workspace (so files
    keep one owner across an objective's tasks), spread over `RECEIPT_SANDBOX_UIDS` so that
    RLIMIT_NPROC, which counts per uid, counts one workspace's processes."""
    first, last = settings.uids
    digest = int.from_bytes(hashlib.sha256(str(workspace).encode()).digest()[:8], "big")
    return first + digest % (last - first + 1)


def _sandbox_uid(workspace: Path, settings: SandboxSettings) -> int | None:
    return uid_for(workspace, settings) if os.geteuid() == 0 and settings.mode == "bwrap" else None


def _make_parents(workspace: Path, settings: SandboxSettings, uid: int | None) -> None:
    """Create the root and every directory between it and `workspace`, traversable but not
    listable by others; refuse a workspace outside the root."""
    root = settings.workspace_root
    if not workspace.is_absolute() or root not in workspace.parents:
        raise SandboxRefused(f"workspace {workspace} is not under RECEIPT_WORKSPACE_ROOT {root}")
    if not root.exists():
        root.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
        root.chmod(DIRECTORY_MODE)
    if uid is not None:
        blocked = searchable_by_others(root)
        if blocked is not None:
            raise SandboxRefused(
                f"RECEIPT_WORKSPACE_ROOT {root} is not reachable by the sandbox's uid: "
                f"{blocked} is not searchable by other users; choose a directory every user "
                "may traverse (e.g. /var/lib/receipt/workspaces)"
            )
    for parent in reversed(workspace.parents):
        if root not in parent.parents:
            continue
        if not parent.exists():
            parent.mkdir(mode=DIRECTORY_MODE, exist_ok=True)
        # Set whenever it is not (not only when just made): a worker that died between the
        # mkdir and the chmod left the directory at the umask's mode, listable, for good.
        if parent.stat().st_mode & 0o777 != DIRECTORY_MODE:
            parent.chmod(DIRECTORY_MODE)


def used_marker(workspace: Path) -> Path:
    """The file whose modification time says when `workspace` was last used: beside it, in its
    parent, which no command reaches (the workspace's own time is the command's to set: a
    `touch -d 2099-01-01 .` kept an idle workspace from the sweep for good)."""
    return workspace.with_name(f".{workspace.name}.used")


def last_used(workspace: Path) -> float:
    """When `workspace` was last used (a time.time()): its marker's time, else (one made before
    markers) its own."""
    try:
        return used_marker(workspace).stat().st_mtime
    except FileNotFoundError:
        return workspace.stat(follow_symlinks=False).st_mtime


def prepare_workspace(workspace: Path, settings: SandboxSettings) -> int | None:
    """Create the workspace (and its parents, traversable but not listable by the sandbox
    uids), owned by the sandbox's host uid when the worker is root, and mark it used now (its
    marker's modification time). Returns that uid (None: the worker is not root, and the
    sandbox maps the worker's own uid)."""
    uid = _sandbox_uid(workspace, settings)
    _make_parents(workspace, settings, uid)
    workspace.mkdir(mode=0o700, exist_ok=True)
    marker = used_marker(workspace)
    marker.touch(mode=0o600)
    os.utime(marker)  # used now: the sweep keeps it (activities/workspace_sweep.py)
    if uid is not None and workspace.stat().st_uid != uid:
        os.chown(workspace, uid, uid)
    return uid


def adopt(legacy: Path, workspace: Path, settings: SandboxSettings) -> bool:
    """Move a workspace of the earlier layout to its place in the organization's tree, unless
    the new one exists already. The caller has checked that `legacy` belongs to the job's
    organization. A root worker gives every file the new workspace's uid (the uid follows the
    path). Returns True when something was moved."""
    if workspace.exists() or not legacy.is_dir() or legacy.is_symlink():
        return False
    if legacy == settings.workspace_root / ORGANIZATIONS_DIR:
        return False  # an earlier objective named `orgs`: its directory is every tree's root now
    uid = _sandbox_uid(workspace, settings)
    _make_parents(workspace, settings, uid)
    if uid is not None:
        # Given first, moved last: the move is the step that says it is done. Moved first, a
        # worker that died before the files were given (or a chown that failed) left them the
        # old uid's for good: every later turn found the new workspace and moved nothing.
        _chown_tree(legacy, uid)
    legacy.rename(workspace)
    log.info(
        "workspace moved into its organization's tree",
        extra={"event": "workspace.adopted", "from": str(legacy), "to": str(workspace)},
    )
    return True


def _chown_tree(top: Path, uid: int) -> None:
    """Give `top` and everything below it (symlinks themselves, never their targets) to `uid`.
    coreutils' chown walks a tree of any depth through directory descriptors (Python's os.walk
    recurses: a workspace a command nested a thousand directories deep raised RecursionError
    and failed every turn of its job). Raises OSError when it could not."""
    failed, error = tree_command(["chown", "-R", "-P", "-h", f"{uid}:{uid}", "--", str(top)])
    if failed:
        raise OSError(f"{top} could not be given to uid {uid}: {error}")


def tree_command(argv: list[str]) -> tuple[bool, str]:
    """Run a coreutils command over a workspace tree (`chown -R`, `chmod -R`, `rm -rf`: they walk
    any depth through directory descriptors and follow no symlink, where Python's walks recurse):
    whether it failed, and the end of what it wrote to stderr."""
    done = subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False,
        env={"PATH": DEFAULT_PATH},
    )  # fmt: skip
    return done.returncode != 0, done.stderr.strip()[-500:]
