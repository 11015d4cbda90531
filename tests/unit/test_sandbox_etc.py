"""The sandbox's /etc view (`activities/sandbox_etc.py`): copied allowed files, mount points
for the allowed directories, a new view when a host file changes. On temporary directories."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities import sandbox_etc
from activities.sandbox_etc import VIEWS, bind_args, etc_view, view_for

ENTRIES = ("hosts", "resolv.conf", "ssl", "absent.conf", "localtime")


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    sandbox_etc.forget()
    yield
    sandbox_etc.forget()


@pytest.fixture
def etc(tmp_path: Path) -> Path:
    etc = tmp_path / "etc"
    (etc / "ssl" / "certs").mkdir(parents=True)
    (etc / "hosts").write_text("127.0.0.1 localhost\n")
    (etc / "resolv.conf").write_text("nameserver 10.0.0.1\n")
    (etc / "shadow").write_text("root:secret\n")  # not allowed: never copied
    (tmp_path / "zone").write_text("UTC\n")
    (etc / "localtime").symlink_to(tmp_path / "zone")  # copied as content, as a bind shows it
    return etc


def test_the_view_holds_the_allowed_files_and_mount_points_for_the_allowed_directories(
    tmp_path: Path, etc: Path
) -> None:
    root = tmp_path / "workspaces"
    view = etc_view(root, ENTRIES, etc)
    assert view.directory.parent == root / VIEWS
    assert sorted(p.name for p in view.directory.iterdir()) == [
        "hosts",
        "localtime",
        "resolv.conf",
        "ssl",
    ]
    assert (view.directory / "hosts").read_text() == "127.0.0.1 localhost\n"
    assert not (view.directory / "localtime").is_symlink()
    assert (view.directory / "localtime").read_text() == "UTC\n"
    assert list((view.directory / "ssl").iterdir()) == []  # bound live on top
    assert view.live == ("ssl",)
    assert (view.directory / "hosts").stat().st_mode & 0o777 == 0o644
    assert view.directory.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in (root / VIEWS).iterdir()] == [view.directory.name]  # no staging


def test_a_changed_host_file_gives_a_new_view_and_an_unchanged_one_the_same(
    tmp_path: Path, etc: Path
) -> None:
    root = tmp_path / "workspaces"
    first = etc_view(root, ENTRIES, etc)
    assert etc_view(root, ENTRIES, etc) == first
    os.utime(first.directory / "hosts", (0, 0))  # the view's own files are not the source
    assert etc_view(root, ENTRIES, etc) == first
    (etc / "resolv.conf").write_text("nameserver 10.9.9.9\n")
    os.utime(etc / "resolv.conf", ns=(1, 1))  # a new mtime even on a coarse clock
    second = etc_view(root, ENTRIES, etc)
    assert second.directory != first.directory
    assert (second.directory / "resolv.conf").read_text() == "nameserver 10.9.9.9\n"
    assert (first.directory / "resolv.conf").read_text() == "nameserver 10.0.0.1\n"


def test_a_view_another_worker_already_wrote_is_used_as_it_is(tmp_path: Path, etc: Path) -> None:
    root = tmp_path / "workspaces"
    view = etc_view(root, ENTRIES, etc)
    sandbox_etc.forget()  # another process: nothing remembered, the directory is there
    assert etc_view(root, ENTRIES, etc) == view


def test_bwrap_binds_the_view_at_etc_then_the_live_directories_on_top(
    tmp_path: Path, etc: Path
) -> None:
    view = etc_view(tmp_path / "workspaces", ENTRIES, etc)
    assert bind_args(view) == [
        "--ro-bind",
        str(view.directory),
        "/etc",
        "--ro-bind-try",
        "/etc/ssl",
        "/etc/ssl",
    ]


def test_no_view_for_an_extra_bind_under_etc_or_a_root_that_cannot_be_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert view_for(tmp_path, ("hosts",), ["/etc/receipt"]) is None
    assert view_for(tmp_path, ("hosts",), ["/etc"]) is None
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with caplog.at_level(logging.WARNING, logger="activities.sandbox"):
        assert view_for(blocked, ("hosts",), []) is None
        assert view_for(blocked, ("hosts",), []) is None
    failed = [r for r in caplog.records if getattr(r, "event", "") == "sandbox.etc_view_failed"]
    assert len(failed) == 1  # said once
    assert view_for(tmp_path / "ok", ("hosts",), ["/opt/tools"]) is not None
