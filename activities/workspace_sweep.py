"""Workspace retention: worker-codex removes a workspace nothing has used for
`RECEIPT_WORKSPACE_RETENTION` whose owner is no longer active ("0", the default, keeps them all).

A workspace is used when a command or an agent turn starts in it (`prepare_workspace` sets the
time of its marker, `.<name>.used` beside it, which no command reaches), and its owner is active
while the database says so: an unsettled job (a standalone task's workspace), an active
objective (its tasks, validate and publish), an unfinished agent job or one whose turn still
runs (its workspace owner's, which continuations share). A workspace older than that and owned
by none of them is renamed out of the way first (`.<name>.removing-<hex>`, which a command
starting just then cannot reach: it makes a fresh one) and then deleted with its marker; a
removal a crash interrupted is finished by the next pass. Each pass removes at most
`REMOVALS_PER_PASS`. An agent job continued after its workspace was removed starts in a fresh
one.
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

from activities.blocking import off_loop
from activities.sandbox_policy import SandboxSettings
from activities.workspaces import (
    AGENT_JOBS_DIR,
    JOBS_DIR,
    OBJECTIVES_DIR,
    ORGANIZATIONS_DIR,
    last_used,
    tree_command,
    used_marker,
    workspace_name,
)
from receipts import metrics, retention
from receipts.store import Store
from receipts.tenancy import caller_id

log = logging.getLogger("activities.workspace_sweep")

SWEEP_INTERVAL_MS = 600_000
REMOVALS_PER_PASS = 100
REMOVING = ".removing-"
KINDS = (JOBS_DIR, OBJECTIVES_DIR, AGENT_JOBS_DIR)

# (organization directory, kind directory) -> the names of the workspaces in use there.
Active = dict[tuple[str, str], set[str]]


class WorkspaceSweeper:
    """One pass at a time over `RECEIPT_WORKSPACE_ROOT/orgs` (a `Ticker`'s `run_once`)."""

    name = "workspace_sweep"

    def __init__(self, store: Store, settings: SandboxSettings, retention: timedelta) -> None:
        self.store = store
        self.root = settings.workspace_root / ORGANIZATIONS_DIR
        self.retention = retention
        metrics.WORKSPACES_REMOVED.labels("idle")

    async def run_once(self) -> int:
        """Remove what is due; the number of workspaces removed."""
        active = await self._active()
        cutoff = time.time() - self.retention.total_seconds()
        due = await off_loop(stale, self.root, active, cutoff)
        removed = 0
        for path in due[:REMOVALS_PER_PASS]:
            if await off_loop(self._remove, path, cutoff):
                removed += 1
        return removed

    async def _active(self) -> Active:
        active: Active = defaultdict(set)
        for organization, kind, owner in await retention.workspace_owners_active(self.store):
            name = workspace_name(owner if kind == AGENT_JOBS_DIR else caller_id(owner))
            active[(workspace_name(organization), kind)].add(name)
        return active

    def _remove(self, path: Path, cutoff: float) -> bool:
        leftover = path.name.startswith(".") and REMOVING in path.name
        idle_s = None
        try:
            if not leftover:
                modified = last_used(path)
                if modified >= cutoff:
                    return False  # used since the scan
                idle_s = round(time.time() - modified)
                moved = path.with_name(f".{path.name}{REMOVING}{uuid.uuid4().hex[:8]}")
                path.rename(moved)
            else:
                moved = path
            _delete(moved)
            if not leftover:
                used_marker(path).unlink(missing_ok=True)
        except FileNotFoundError:
            return False  # another worker's pass (a shared volume) took it first
        except OSError as exc:
            metrics.WORKSPACE_REMOVALS_FAILED.inc()
            log.warning(
                "workspace not removed: %s",
                exc,
                extra={"event": "workspace.remove_failed", "path": str(path)},
            )
            return False
        metrics.WORKSPACES_REMOVED.labels("leftover" if leftover else "idle").inc()
        log.info(
            "workspace removed",
            extra={
                "event": "workspace.removed",
                "path": str(path),
                "idleS": idle_s,
            },
        )
        return True


def stale(root: Path, active: Active, cutoff: float) -> list[Path]:
    """The workspaces under `root` (`<root>/<organization>/<kind>/<name>`) last used before
    `cutoff` (a time.time()) and not `active`, oldest first, then the leftovers of interrupted
    removals (last: a leftover that keeps failing never takes an idle workspace's turn)."""
    found: list[tuple[float, Path]] = []
    for organization in _directories(root):
        for kind in KINDS:
            in_use = active.get((organization.name, kind), set())
            for entry in _directories(organization / kind):
                if entry.name.startswith(".") and REMOVING in entry.name:
                    found.append((math.inf, entry))
                    continue
                if entry.name in in_use:
                    continue
                try:
                    modified = last_used(entry)
                except FileNotFoundError:
                    continue  # another worker's pass (a shared volume) moved it just now
                if modified < cutoff:
                    found.append((modified, entry))
    return [path for _, path in sorted(found)]


def _delete(top: Path) -> None:
    """Delete `top` and everything below it: the permissions given back to the worker first (a
    command may have taken them off a directory, `chmod 000`), then the tree removed. The
    workspace is idle and renamed aside: no command of it runs. coreutils do both: they walk a
    tree of any depth and path length through directory descriptors and follow no symlink.
    Python's walks recurse (os.walk, shutil.rmtree): a command's `mkdir d; cd d` a thousand
    times over made its workspace one the sweep could never delete (RecursionError, every pass).
    Raises OSError when something is left."""
    tree_command(["chmod", "-R", "u+rwx", "--", str(top)])
    _, error = tree_command(["rm", "-rf", "--", str(top)])
    if os.path.lexists(top):
        raise OSError(f"{top} was not deleted: {error}")


def _directories(path: Path) -> list[Path]:
    try:
        with os.scandir(path) as entries:
            return [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []
