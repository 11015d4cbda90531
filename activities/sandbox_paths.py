"""Looking at a path in a workspace from the worker, which a command may be changing meanwhile.

Another command of the same workspace (an objective's tasks share one, and any two jobs naming
the same objective) can turn a name into a symbolic link to a host path between two looks of the
worker. So the worker resolves a path once (`resolved`) and then looks at what is there through
that resolved path with no symbolic link followed on the way (`mode_at`): a link that appeared
since reads as nothing there, never as the host file it leads to, and the answer a tenant gets
does not depend on what the host has where its commands cannot look.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def resolved(path: str | Path) -> str | None:
    """`os.path.realpath(path)`, or None when the path changed while it was being resolved (a
    name stopped being a link between two looks: EINVAL)."""
    try:
        return os.path.realpath(path)
    except OSError:
        return None


def mode_at(real: str, access: int = os.F_OK) -> int | None:
    """The type and mode (`st_mode`) of what is at `real`, an absolute resolved path, when the
    worker may `access` it; None when nothing is there or a symbolic link is met on the way (each
    component is opened in the one before it, none followed)."""
    fd = os.open("/", os.O_PATH | os.O_CLOEXEC)
    try:
        for part in Path(real).parts[1:]:
            fd, parent = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd), fd
            os.close(parent)
        mode = os.fstat(fd).st_mode
        if stat.S_ISLNK(mode) or not os.access(f"/proc/self/fd/{fd}", access):
            return None
        return mode
    except OSError:
        return None
    finally:
        os.close(fd)
