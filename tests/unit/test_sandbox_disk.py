"""The walk that measures a running command's workspace (`activities/sandbox_disk.py`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from activities.sandbox_disk import usage

MIB = 1024 * 1024
FAR = 1 << 40


def test_a_file_counts_what_it_takes_on_disk_a_sparse_one_only_its_written_part(
    tmp_path: Path,
) -> None:
    (tmp_path / "full").write_bytes(b"x" * MIB)
    with open(tmp_path / "sparse", "wb") as sparse:
        sparse.truncate(1024 * MIB)
    found = usage(tmp_path, FAR, 1_000)
    assert MIB <= found.bytes < 2 * MIB
    assert found.files == 2


def test_a_file_linked_many_times_counts_once_each_link_an_entry(tmp_path: Path) -> None:
    (tmp_path / "data").write_bytes(b"x" * MIB)
    (tmp_path / "links").mkdir()
    for i in range(50):
        os.link(tmp_path / "data", tmp_path / "links" / str(i))
    found = usage(tmp_path, FAR, 1_000)
    assert found.bytes < 2 * MIB
    assert found.files == 52


def test_the_walk_stops_past_a_bound_and_follows_no_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"x" * MIB)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "link").symlink_to(outside)
    assert usage(workspace, FAR, 1_000).bytes < MIB
    for i in range(100):
        (workspace / str(i)).touch()
    assert usage(workspace, FAR, 10).files == 11


def test_a_directory_the_walk_cannot_read_counts_as_past_the_bound(tmp_path: Path) -> None:
    # A worker that is not root runs commands as its own uid: a command's `chmod 000 d` hid
    # what d held from the walk (3 MB read as 4 KiB with a bound of 1 MiB).
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "big").write_bytes(b"x" * 3 * MIB)
    real_scandir = os.scandir

    def refusing(path: str) -> Any:
        if path == str(hidden):
            raise PermissionError(13, "Permission denied", path)
        return real_scandir(path)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "scandir", refusing)
        found = usage(tmp_path, MIB, 1_000)
    assert found.past(MIB, 1_000)
