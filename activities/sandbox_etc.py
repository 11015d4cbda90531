"""The sandbox's /etc as one read-only bind of a copied view instead of one bind per entry.

bwrap binding each allowed entry of /etc on its own costs two or three mount calls per entry,
about a fifth of a `true` command's start (`tools/bench/README.md`). The allowed files every user may
read are copied into a view directory, which the sandbox binds as its /etc; the allowed
directories (certificates, the loader's configuration, alternatives) and any allowed file that
is not world-readable are still bound from the host on top of it, at mount points the view
holds, so what a command can read is what it could read before.

Trust: the views live in a directory of this process's own, `<tmp>/receipt-sandbox-etc-<pid>-*`
(mode 0711, owned by the worker, made by `mkdtemp`), never where anyone else may write, so no
other user, job or worker can plant or change a view. A sandboxed command sees its view only
read-only at /etc and has a private /tmp, so it cannot reach the directory either.

Freshness: every command first compares a signature of the allowed entries (per file: device,
inode, size, mode, modification and change times, following symlinks as bwrap's bind does) with
the one its view was copied from; any difference (an edit, a replaced file, `cp -p`, since the
change time cannot be set back) makes a new view, written off the event loop. A view a running
command may still use is left in place; the worker removes the directory when it stops cleanly,
and a later worker removes it when it finds the process gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from activities.blocking import off_loop

PREFIX = "receipt-sandbox-etc-"
ETC = Path("/etc")

log = logging.getLogger("activities.sandbox")

# Per existing entry: its name, how it reaches the sandbox, and what identifies its content.
Entry = tuple[str, str, tuple[int, ...]]
Signature = tuple[Entry, ...]
COPIED, LIVE_FILE, LIVE_DIR = "copied", "live-file", "live-dir"


@dataclass(frozen=True)
class EtcView:
    """A copied /etc: `directory` to bind at /etc, then each of `live` bound on top of it."""

    directory: Path
    live: tuple[str, ...]


def signature(entries: Iterable[str], etc: Path = ETC) -> Signature:
    """What a view of `entries` is made from; absent (or unstattable) entries are left out, as
    `--ro-bind-try` leaves them out."""
    found: list[Entry] = []
    for name in entries:
        try:
            info = os.stat(f"{etc}/{name}")
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode):
            found.append((name, LIVE_DIR, ()))  # bound live: its content is not copied
        elif not info.st_mode & stat.S_IROTH:
            found.append((name, LIVE_FILE, ()))  # readable only as the host allows it
        else:
            identity = (
                info.st_dev,
                info.st_ino,
                info.st_size,
                info.st_mode,
                info.st_mtime_ns,
                info.st_ctime_ns,
            )
            found.append((name, COPIED, identity))
    return tuple(found)


class EtcViews:
    """This process's views of `entries` of `etc`: the current one, rebuilt when the host's
    entries change. `current()` is a few `stat` calls; `build()` writes (run it in a thread)."""

    def __init__(self, entries: tuple[str, ...], etc: Path = ETC, tmp: Path | None = None) -> None:
        self.entries = entries
        self.etc = etc
        self.tmp = tmp
        self._home: Path | None = None
        self._made = 0
        self._lock = threading.Lock()
        # The signature last built for, and its view (None: building it failed).
        self._built: tuple[Signature, EtcView | None] | None = None

    def current(self) -> tuple[bool, EtcView | None]:
        """`(fresh, view)`: fresh when the last build was for the host's entries as they are
        now (its view, or None when that build failed: not retried until they change)."""
        if self._built is None or self._built[0] != signature(self.entries, self.etc):
            return False, None
        return True, self._built[1]

    def build(self) -> EtcView | None:
        """Copy a view of the host's entries as they are now; None (logged) when it cannot be
        written. Blocking."""
        with self._lock:
            sig = signature(self.entries, self.etc)
            if self._built is not None and self._built[0] == sig:
                return self._built[1]  # another command built it meanwhile
            return self._build(sig)

    def _build(self, sig: Signature) -> EtcView | None:
        try:
            view = self._write(sig)
        except OSError as exc:
            log.warning(
                "could not write the sandbox's /etc view; binding each entry instead",
                extra={"event": "sandbox.etc_view_failed", "error": str(exc)},
            )
            self._built = (sig, None)
            return None
        self._built = (sig, view)
        return view

    def remove(self) -> None:
        """Remove every view this process made (once no command can be using one)."""
        with self._lock:
            if self._home is not None:
                shutil.rmtree(self._home, ignore_errors=True)
            self._home, self._built = None, None

    def _write(self, sig: Signature) -> EtcView:
        if self._home is None:
            remove_orphans(Path(self.tmp or tempfile.gettempdir()))
            self._home = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=self.tmp))
            self._home.chmod(0o711)  # traversable by the sandbox's uid, listable by no one
        self._made += 1
        directory = self._home / f"v{self._made}"
        directory.mkdir(mode=0o700)
        try:
            for name, how, _ in sig:
                target = directory / name
                if how == LIVE_DIR:
                    target.mkdir(mode=0o755)
                elif how == LIVE_FILE:
                    target.touch(mode=0o000)
                else:
                    shutil.copyfile(self.etc / name, target)  # the content a bind would show
                    target.chmod(0o644)  # world-readable on the host too, or it is not copied
            directory.chmod(0o755)
        except OSError:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        live = tuple(name for name, how, _ in sig if how != COPIED)
        return EtcView(directory, live)


def remove_orphans(tmp: Path) -> None:
    """Remove view directories of this user's processes that are gone (a SIGKILLed worker's)."""
    with contextlib.suppress(OSError):
        for entry in tmp.iterdir():
            if not entry.name.startswith(PREFIX):
                continue
            pid = entry.name.removeprefix(PREFIX).split("-", 1)[0]
            if not pid.isdigit():
                continue
            with contextlib.suppress(OSError):
                info = entry.lstat()
                if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                    continue
                if not Path(f"/proc/{pid}").exists():
                    shutil.rmtree(entry, ignore_errors=True)


def bind_args(view: EtcView, etc: Path = ETC) -> list[str]:
    """bwrap's options for the view: /etc itself, then the live entries on top."""
    args = ["--ro-bind", str(view.directory), str(etc)]
    for name in view.live:
        args += ["--ro-bind-try", str(etc / name), str(etc / name)]
    return args


def wanted(ro_binds: Iterable[str]) -> bool:
    """Whether a view can be used: not when a `RECEIPT_SANDBOX_RO_BINDS` path lies under /etc
    (its mount point cannot be made in a read-only view)."""
    return not any(Path(bind) == ETC or ETC in Path(bind).parents for bind in ro_binds)


_views: dict[tuple[str, ...], EtcViews] = {}


async def view_for(entries: tuple[str, ...], ro_binds: Iterable[str]) -> EtcView | None:
    """This process's view of `entries` for a sandbox, or None: each entry is then bound on
    its own (an extra bind under /etc, or a view that could not be written)."""
    if not wanted(ro_binds):
        return None
    views = _views.get(entries)
    if views is None:
        views = _views[entries] = EtcViews(entries)
    fresh, view = views.current()
    if fresh:
        return view
    return await off_loop(views.build)


def remove_views() -> None:
    """Remove this process's views: at a worker's clean stop, after it drained its commands."""
    for views in _views.values():
        views.remove()
    _views.clear()
