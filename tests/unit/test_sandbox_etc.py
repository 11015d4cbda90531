"""The sandbox's /etc view (`activities/sandbox_etc.py`): copied world-readable files, mount
points for what is bound live, a new view when a host file changes, a private home. On
temporary directories."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from activities.sandbox_etc import PREFIX, EtcViews, bind_args, remove_orphans, wanted

ENTRIES = ("hosts", "resolv.conf", "ssl", "absent.conf", "localtime", "gitconfig")


@pytest.fixture
def etc(tmp_path: Path) -> Path:
    etc = tmp_path / "etc"
    (etc / "ssl" / "certs").mkdir(parents=True)
    (etc / "hosts").write_text("127.0.0.1 localhost\n")
    (etc / "resolv.conf").write_text("nameserver 10.0.0.1\n")
    (etc / "shadow").write_text("root:secret\n")  # not allowed: never copied
    (etc / "gitconfig").write_text("[credential]\n\thelper = store\n")
    (etc / "gitconfig").chmod(0o600)  # allowed, but readable only as the host allows
    (tmp_path / "zone").write_text("UTC\n")
    (etc / "localtime").symlink_to(tmp_path / "zone")  # copied as content, as a bind shows it
    return etc


def views(tmp_path: Path, etc: Path) -> EtcViews:
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    return EtcViews(ENTRIES, etc, tmp)


def test_the_view_copies_world_readable_files_and_holds_mount_points_for_the_rest(
    tmp_path: Path, etc: Path
) -> None:
    view = views(tmp_path, etc).build()
    assert view is not None
    assert sorted(p.name for p in view.directory.iterdir()) == [
        "gitconfig",
        "hosts",
        "localtime",
        "resolv.conf",
        "ssl",
    ]
    assert (view.directory / "hosts").read_text() == "127.0.0.1 localhost\n"
    assert (view.directory / "localtime").read_text() == "UTC\n"
    assert not (view.directory / "localtime").is_symlink()
    # The 0600 file is not copied: an empty, unreadable mount point for the host's own file.
    assert (view.directory / "gitconfig").stat().st_size == 0
    assert (view.directory / "gitconfig").stat().st_mode & 0o777 == 0
    assert list((view.directory / "ssl").iterdir()) == []
    assert view.live == ("ssl", "gitconfig")
    assert (view.directory / "hosts").stat().st_mode & 0o777 == 0o644
    assert view.directory.stat().st_mode & 0o777 == 0o755
    home = view.directory.parent
    assert home.name.startswith(f"{PREFIX}{os.getpid()}-")
    assert home.stat().st_mode & 0o777 == 0o711  # traversable, listable by no one else
    assert home.stat().st_uid == os.geteuid()


def test_a_changed_host_file_gives_a_new_view_and_an_unchanged_one_the_same(
    tmp_path: Path, etc: Path
) -> None:
    made = views(tmp_path, etc)
    assert made.current() == (False, None)  # nothing built yet
    first = made.build()
    assert first is not None
    assert made.current() == (True, first)
    assert made.build() == first  # fresh: not written again
    # Rewritten in place with its size and modification time put back (`cp -p`, `rsync -t`):
    # the change time still moves.
    before = (etc / "resolv.conf").stat()
    (etc / "resolv.conf").write_text("nameserver 10.9.9.9\n")
    os.utime(etc / "resolv.conf", ns=(before.st_atime_ns, before.st_mtime_ns))
    assert made.current() == (False, None)
    second = made.build()
    assert second is not None and second.directory != first.directory
    assert (second.directory / "resolv.conf").read_text() == "nameserver 10.9.9.9\n"
    # The old view stays for the commands that may still have it as their /etc.
    assert (first.directory / "resolv.conf").read_text() == "nameserver 10.0.0.1\n"


def test_a_view_that_cannot_be_written_is_said_once_and_not_retried_until_etc_changes(
    tmp_path: Path, etc: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    made = EtcViews(ENTRIES, etc, blocked)  # its temporary directory is a file
    with caplog.at_level(logging.WARNING, logger="activities.sandbox"):
        assert made.build() is None
        assert made.current() == (True, None)  # the failure is remembered
    failed = [r for r in caplog.records if getattr(r, "event", "") == "sandbox.etc_view_failed"]
    assert len(failed) == 1
    (etc / "hosts").write_text("127.0.0.2 other\n")
    assert made.current() == (False, None)  # a change is worth another try


def test_bwrap_binds_the_view_at_etc_then_the_live_entries_on_top(
    tmp_path: Path, etc: Path
) -> None:
    view = views(tmp_path, etc).build()
    assert view is not None
    assert bind_args(view) == [
        "--ro-bind",
        str(view.directory),
        "/etc",
        "--ro-bind-try",
        "/etc/ssl",
        "/etc/ssl",
        "--ro-bind-try",
        "/etc/gitconfig",
        "/etc/gitconfig",
    ]


def test_no_view_with_an_extra_bind_under_etc() -> None:
    assert not wanted(["/etc/receipt"])
    assert not wanted(["/etc"])
    assert wanted(["/opt/tools", "/etcetera"])


def test_a_gone_process_s_views_are_removed_and_a_live_one_s_kept(tmp_path: Path) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    ).stdout.strip()
    dead = tmp_path / f"{PREFIX}{gone}-abc"
    alive = tmp_path / f"{PREFIX}{os.getpid()}-def"
    other = tmp_path / "unrelated-dir"
    for directory in (dead, alive, other):
        (directory / "v1").mkdir(parents=True)
    remove_orphans(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, other.name])
    shutil.rmtree(alive)


def test_a_clean_stop_removes_the_process_s_views(tmp_path: Path, etc: Path) -> None:
    made = views(tmp_path, etc)
    view = made.build()
    assert view is not None and view.directory.is_dir()
    made.remove()
    assert not view.directory.parent.exists()
    assert made.current() == (False, None)
    again = made.build()  # a later command (none should come) gets a new home
    assert again is not None and again.directory.is_dir()
    made.remove()
