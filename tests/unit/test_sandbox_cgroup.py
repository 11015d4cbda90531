"""Where sandbox cgroups are made, read from a cgroup tree laid out in a temporary directory."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from activities.sandbox_cgroup import (
    CgroupPlan,
    CgroupUnavailable,
    SandboxCgroup,
    find_plan,
    own_cgroups,
)
from receipts import metrics

V1_PROC = "9:name=systemd:/\n8:pids:/w\n4:memory:/w\n2:cpu,cpuacct:/\n0::/\n"
V2_PROC = "0::/worker.slice/receipt\n"


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_own_cgroups_reads_v1_controllers_and_the_v2_path() -> None:
    own = own_cgroups(V1_PROC)
    assert (own["memory"], own["pids"], own["cpuacct"], own[""]) == ("/w", "/w", "/", "/")
    assert own_cgroups(V2_PROC) == {"": "/worker.slice/receipt"}


def test_v2_is_used_when_the_workers_cgroup_delegates_memory_and_pids(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {
            "cgroup.controllers": "cpu memory pids",
            "worker.slice/receipt/cgroup.subtree_control": "memory pids",
        },
    )
    assert find_plan("auto", root, V2_PROC) == CgroupPlan(2, (root / "worker.slice/receipt",))


def test_v2_without_delegation_and_no_v1_means_rlimits_only(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {"cgroup.controllers": "memory pids", "worker.slice/receipt/cgroup.subtree_control": ""},
    )
    assert find_plan("auto", root, V2_PROC) is None


def test_v1_is_used_when_its_memory_and_pids_hierarchies_are_writable(tmp_path: Path) -> None:
    root = tree(tmp_path, {"memory/w/cgroup.procs": "", "pids/w/cgroup.procs": ""})
    assert find_plan("auto", root, V1_PROC) == CgroupPlan(1, (root / "memory/w", root / "pids/w"))
    assert (
        find_plan("auto", tree(tmp_path / "other", {"memory/w/cgroup.procs": ""}), V1_PROC) is None
    )


def test_off_and_bad_settings(tmp_path: Path) -> None:
    assert find_plan("off", tmp_path, V1_PROC) is None
    with pytest.raises(ValueError, match="auto, off or an absolute path"):
        find_plan("relative/dir", tmp_path, V1_PROC)
    with pytest.raises(CgroupUnavailable, match="RECEIPT_SANDBOX_CGROUP"):
        find_plan(str(tmp_path), tmp_path, V1_PROC)
    delegated = tree(tmp_path / "d", {"cgroup.subtree_control": "pids memory io"})
    assert find_plan(str(delegated), tmp_path, V1_PROC) == CgroupPlan(2, (delegated,))


def test_the_join_prefix_writes_every_procs_file_then_execs(tmp_path: Path) -> None:
    cgroup = SandboxCgroup(
        CgroupPlan(1, (tmp_path / "m", tmp_path / "p")), (tmp_path / "m/x", tmp_path / "p/x")
    )
    prefix = cgroup.join_prefix()
    assert prefix[:2] == ["/bin/sh", "-c"]
    assert prefix[4:] == [
        str(tmp_path / "m/x/cgroup.procs"),
        str(tmp_path / "p/x/cgroup.procs"),
        "--",
    ]


def test_a_cgroup_that_cannot_be_removed_is_logged_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cgroup left behind (its directory still busy after every try) is a leak an operator
    must hear of: logged sandbox.cgroup_left and counted in receipt_sandbox_cgroups_left_total
    (alert ReceiptSandboxCgroupsLeft). A removed one counts nothing."""
    removed = tmp_path / "m/gone"
    removed.mkdir(parents=True)
    busy = tmp_path / "m/busy"
    busy.mkdir()
    (busy / "still-here").write_text("")  # rmdir fails as on a cgroup with a process left
    before = metrics.SANDBOX_CGROUPS_LEFT._value.get()
    SandboxCgroup(CgroupPlan(2, (tmp_path / "m",)), (removed,)).remove()
    assert not removed.exists()
    assert metrics.SANDBOX_CGROUPS_LEFT._value.get() == before
    with caplog.at_level(logging.WARNING, logger="activities.sandbox"):
        SandboxCgroup(CgroupPlan(2, (tmp_path / "m",)), (busy,)).remove()
    assert metrics.SANDBOX_CGROUPS_LEFT._value.get() == before + 1
    assert [r.event for r in caplog.records] == ["sandbox.cgroup_left"]  # type: ignore[attr-defined]
