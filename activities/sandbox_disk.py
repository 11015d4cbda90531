"""How much of the workspace volume a running command may take: its workspace's bytes and
files, measured while it runs (`activities/sandbox.py` kills the sandbox past either bound).

The volume under `RECEIPT_WORKSPACE_ROOT` is shared by every workspace of the worker, and
RLIMIT_FSIZE bounds one file only: a command writing files under that size, or empty ones, took
the whole volume, and the commands of other organizations beside it then failed their writes
and the next job could not even make its workspace. No kernel quota is assumed (the volume may
have none), so the workspace is walked: at once, then every DISK_CHECK_S at least and never more
than a tenth of the time (a walk of a large workspace costs the worker CPU). A walk stops as
soon as it is past a bound; a file's allocated blocks count (a sparse file its written part),
a file linked twice once, and a directory the worker cannot read as past the bound. Between two
walks a command may write past the bound by what it writes in that time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from activities.blocking import off_loop

log = logging.getLogger("activities.sandbox")

# What one command's workspace may hold by default (RECEIPT_SANDBOX_WORKSPACE_MB and _FILES).
WORKSPACE_MB = 10_240
WORKSPACE_FILES = 1_000_000  # a large checkout (node_modules of a monorepo) passes 200 000
DISK_CHECK_S = 1.0
# A walk takes at most this share of the time between two (the wait grows with the walk).
WALK_SHARE = 0.1


@dataclass(frozen=True)
class Usage:
    """What a walk found (up to where it stopped): allocated bytes and directory entries, and
    whether a directory could not be read (what it holds cannot be counted)."""

    bytes: int
    files: int
    unreadable: bool = False

    def past(self, max_bytes: int, max_files: int) -> bool:
        return self.unreadable or self.bytes > max_bytes or self.files > max_files


def usage(top: Path, max_bytes: int, max_files: int) -> Usage:
    """The workspace's allocated bytes and entries, not following symlinks nor leaving its
    file system; stops as soon as either is past its bound (blocking)."""
    total, files = 0, 0
    seen: set[tuple[int, int]] = set()
    try:
        device = top.stat(follow_symlinks=False).st_dev
    except OSError:
        return Usage(0, 0)
    pending = [str(top)]
    while pending:
        try:
            entries = os.scandir(pending.pop())
        except PermissionError:
            # A worker that is not root runs commands as its own uid: a directory the command
            # made unreadable (chmod 000) would hide what it holds from the walk.
            return Usage(total, files, unreadable=True)
        except OSError:
            continue
        with contextlib.suppress(OSError), entries:
            for entry in entries:
                files += 1
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if info.st_dev != device:
                    continue
                if info.st_nlink > 1:
                    if (info.st_dev, info.st_ino) in seen:
                        continue
                    seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                if total > max_bytes or files > max_files:
                    return Usage(total, files)
    return Usage(total, files)


async def watch(workspace: Path, max_mb: int, max_files: int) -> Usage:
    """Walk `workspace` until it is past `max_mb` MiB or `max_files` entries; return what was
    found then (logged `sandbox.disk_limit`). Runs until cancelled otherwise."""
    max_bytes = max_mb * 1024 * 1024
    while True:
        started = time.monotonic()
        found = await off_loop(usage, workspace, max_bytes, max_files)
        if found.past(max_bytes, max_files):
            log.warning(
                "a sandboxed command was killed: its workspace is past its bound "
                "(%d MiB, %d files; a directory it cannot read counts as past it)",
                max_mb,
                max_files,
                extra={
                    "event": "sandbox.disk_limit",
                    "workspace": str(workspace),
                    "usedBytes": found.bytes,
                    "usedFiles": found.files,
                    "maxMb": max_mb,
                    "maxFiles": max_files,
                    "unreadable": found.unreadable,
                },
            )
            return found
        walked = time.monotonic() - started
        await asyncio.sleep(max(DISK_CHECK_S, walked / WALK_SHARE))
