"""The sandbox's /etc as one read-only bind instead of one per allowed entry.

bwrap binding each allowed file of /etc on its own costs two or three mount calls per file,
about 4 ms of every command's start (`docs/bench.md`). The allowed regular files are copied
instead into a view directory, `<RECEIPT_WORKSPACE_ROOT>/.sandbox-etc/<digest>/`, which the
sandbox binds as its /etc; the allowed directories (certificates, the loader's configuration,
alternatives) are still bound live on top of it, at mount points made in the view.

A view is named by a digest of what it was copied from (each file's device, inode, size and
modification time, following symlinks as bwrap's bind does), so a file changed on the host
(`resolv.conf`, `hosts`) gives a new view at the next command: every command checks the
signature first (one `stat` per allowed name). A view is written to a temporary directory and
renamed into place, so workers sharing the workspace root never see half of one. The leading
dot keeps the name apart from every workspace (their names start with a letter or digit).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import shutil
import stat
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

VIEWS = ".sandbox-etc"
ETC = Path("/etc")

log = logging.getLogger("activities.sandbox")
_warned: set[str] = set()

Signature = tuple[tuple[str, str, int, int, int, int], ...]


@dataclass(frozen=True)
class EtcView:
    """A copied /etc: `directory` to bind at /etc, then each of `live` bound on top of it."""

    directory: Path
    live: tuple[str, ...]


_current: dict[tuple[Path, Path, tuple[str, ...]], tuple[Signature, EtcView]] = {}


def signature(entries: Iterable[str], etc: Path = ETC) -> Signature:
    """What the view of `entries` is copied from: per existing entry, its kind and identity."""
    found = []
    for name in entries:
        try:
            info = (etc / name).stat()
        except OSError:
            continue  # absent (or unreadable): left out, as `--ro-bind-try` leaves it out
        kind = "dir" if stat.S_ISDIR(info.st_mode) else "file"
        identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        found.append((name, kind, *identity))
    return tuple(found)


def etc_view(root: Path, entries: tuple[str, ...], etc: Path = ETC) -> EtcView:
    """The view of `entries` of `etc` under the workspace `root`, made when it is missing or
    when a file it was copied from changed (OSError when it cannot be written)."""
    key = (root, etc, entries)
    sig = signature(entries, etc)
    cached = _current.get(key)
    if cached is not None and cached[0] == sig:
        return cached[1]
    digest = hashlib.sha256(repr((str(etc), sig)).encode()).hexdigest()[:20]
    live = tuple(name for name, kind, *_ in sig if kind == "dir")
    view = EtcView(root / VIEWS / digest, live)
    if not view.directory.is_dir():
        _write(view, sig, etc)
    _current[key] = (sig, view)
    return view


def _write(view: EtcView, sig: Signature, etc: Path) -> None:
    parent = view.directory.parent
    parent.mkdir(parents=True, exist_ok=True)
    parent.chmod(0o755)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=parent))
    try:
        for name, kind, *_ in sig:
            target = staging / name
            if kind == "dir":
                target.mkdir(mode=0o755)  # a mount point for the live bind
            else:
                shutil.copyfile(etc / name, target)  # the content, as a bind would show it
                target.chmod(0o644)
        staging.chmod(0o755)
        try:
            staging.rename(view.directory)
        except OSError:
            if not view.directory.is_dir():  # not another worker's identical view
                raise
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(staging)


def view_for(root: Path, entries: tuple[str, ...], ro_binds: Iterable[str]) -> EtcView | None:
    """The view a sandbox binds as /etc, or None: each entry is then bound on its own. None
    when a `RECEIPT_SANDBOX_RO_BINDS` path lies under /etc (its mount point cannot be made in
    a read-only view) or when the view cannot be written (said once, `sandbox.etc_view_failed`;
    commands still run, only slower to start)."""
    if any(Path(bind) == ETC or ETC in Path(bind).parents for bind in ro_binds):
        return None
    try:
        return etc_view(root, entries)
    except OSError as exc:
        if str(root) not in _warned:
            _warned.add(str(root))
            log.warning(
                "could not write the sandbox's /etc view; binding each entry instead",
                extra={"event": "sandbox.etc_view_failed", "root": str(root), "error": str(exc)},
            )
        return None


def forget() -> None:
    """Drop the remembered views (tests)."""
    _current.clear()


def bind_args(view: EtcView, etc: Path = ETC) -> list[str]:
    """bwrap's options for the view: /etc itself, then the live directories on top."""
    args = ["--ro-bind", str(view.directory), str(etc)]
    for name in view.live:
        args += ["--ro-bind-try", str(etc / name), str(etc / name)]
    return args
