"""Workspaces: one tree per organization, names from ids, uids, and the earlier layout moved in."""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from activities.sandbox_policy import SandboxRefused, SandboxSettings
from activities.workspaces import (
    adopt,
    agent_job_workspace,
    job_workspace,
    legacy_objective_workspace,
    objective_workspace,
    prepare_workspace,
    uid_for,
    workspace_name,
)
from receipts.tenancy import scoped_id

SETTINGS = SandboxSettings(workspace_root=Path("/srv/ws"), uids=(50_000, 50_009))


@pytest.mark.parametrize(
    ("identifier", "kept"),
    [
        ("job-1", True),
        ("org:a@b.c_d", True),
        ("..", False),
        ("a/b", False),
        ("x\ny", False),
        (".hidden", False),
        ("", False),
        ("a" * 201, False),
    ],
)
def test_workspace_names_are_the_id_or_a_digest(identifier: str, kept: bool) -> None:
    name = workspace_name(identifier)
    assert (name == identifier) is kept
    assert "/" not in name and name not in (".", "..") and name
    if not kept:
        assert name.startswith("%")


def test_every_workspace_is_in_its_organizations_tree_under_the_callers_id() -> None:
    objective = scoped_id("org-a", "release")
    assert objective_workspace("org-a", objective, SETTINGS) == Path(
        "/srv/ws/orgs/org-a/objectives/release"
    )
    assert job_workspace("org-a", scoped_id("org-a", "build-1"), SETTINGS) == Path(
        "/srv/ws/orgs/org-a/jobs/build-1"
    )
    assert agent_job_workspace("org-a", "7743f9a3", SETTINGS) == Path(
        "/srv/ws/orgs/org-a/agent-jobs/7743f9a3"
    )


@pytest.mark.parametrize("named", ["release", "..", "../org-a", "../../org-a/objectives/release"])
def test_two_organizations_never_share_a_workspace_whatever_id_one_names(named: str) -> None:
    mine = objective_workspace("org-a", scoped_id("org-a", "release"), SETTINGS)
    for workspace in (
        objective_workspace("org-b", named, SETTINGS),
        objective_workspace("org-b", scoped_id("org-a", "release"), SETTINGS),
        job_workspace("org-b", named, SETTINGS),
        agent_job_workspace("org-b", named, SETTINGS),
    ):
        assert workspace != mine
        assert workspace.parent.parent == Path("/srv/ws/orgs/org-b")
        assert ".." not in workspace.parts


def test_organization_names_that_are_not_safe_are_digests() -> None:
    for organization in ("..", "a/b", "orgs"):
        root = objective_workspace(organization, "o1", SETTINGS).parent.parent
        assert root.parent == Path("/srv/ws/orgs") and ".." not in root.parts


def test_a_job_without_an_organization_gets_no_workspace() -> None:
    with pytest.raises(SandboxRefused, match="without an organization"):
        job_workspace(None, "watchdog:1", SETTINGS)


def test_each_workspace_has_one_uid_in_the_range() -> None:
    uids = {uid_for(Path(f"/srv/ws/w{i}"), SETTINGS) for i in range(200)}
    assert uids <= set(range(50_000, 50_010)) and len(uids) > 1
    workspace = Path("/srv/ws/orgs/a/jobs/j1")
    assert uid_for(workspace, SETTINGS) == uid_for(Path(str(workspace)), SETTINGS)


def test_an_earlier_workspace_is_moved_into_place_once(tmp_path: Path) -> None:
    settings = SandboxSettings(mode="none", workspace_root=tmp_path / "ws")
    legacy = legacy_objective_workspace("release", settings)
    legacy.mkdir(parents=True)
    (legacy / "secret.txt").write_text("kept")
    target = objective_workspace("org-a", "release", settings)
    assert adopt(legacy, target, settings)
    assert (target / "secret.txt").read_text() == "kept" and not legacy.exists()
    legacy.mkdir()
    assert not adopt(legacy, target, settings)  # the new one exists: nothing moves again
    assert (settings.workspace_root / "orgs").stat().st_mode & 0o777 == 0o711


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to the sandbox's uid")
def test_a_moved_workspace_belongs_to_the_uid_of_its_new_path(workspace_root: Path) -> None:
    root = workspace_root / f"unit-{uuid.uuid4().hex[:8]}"  # traversable by other uids
    settings = SandboxSettings(workspace_root=root, uids=(50_000, 50_009))
    legacy = legacy_objective_workspace("release", settings)
    prepare_workspace(legacy, settings)
    (legacy / "sub").mkdir()
    (legacy / "sub" / "file").write_text("x")
    target = objective_workspace("org-a", "release", settings)
    assert adopt(legacy, target, settings)
    uid = uid_for(target, settings)
    owners = {p.lstat().st_uid for p in [target, *target.rglob("*")]}
    assert owners == {uid}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to the sandbox's uid")
def test_a_moved_workspace_nested_thousands_deep_is_given_whole_and_no_link_followed(
    workspace_root: Path, tmp_path: Path
) -> None:
    """os.walk recursed: a legacy workspace a command had nested 1 500 directories deep raised
    RecursionError out of `adopt`, and every turn of its job failed on it."""
    root = workspace_root / f"unit-{uuid.uuid4().hex[:8]}"
    settings = SandboxSettings(workspace_root=root, uids=(50_000, 50_009))
    legacy = legacy_objective_workspace("deep", settings)
    prepare_workspace(legacy, settings)
    host_file = tmp_path / "host.txt"
    host_file.write_text("the host's")
    (legacy / "link").symlink_to(host_file)
    bottom = nest(legacy, 1_500)
    try:
        target = objective_workspace("org-a", "deep", settings)
        assert adopt(legacy, target, settings)
        uid = uid_for(target, settings)
        assert (target / "link").lstat().st_uid == uid and host_file.stat().st_uid == 0
        assert os.stat("locked", dir_fd=bottom).st_uid == uid
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)
        os.close(bottom)


def nest(top: Path, depth: int) -> int:
    """`d/d/…/d/locked` `depth` deep under `top`, made through descriptors (what `mkdir d; cd d`
    in a loop leaves); returns a descriptor of the last `d`."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    os.mkdir("locked", dir_fd=fd)
    return fd


def test_an_earlier_objective_named_orgs_is_never_moved_into_its_own_tree(tmp_path: Path) -> None:
    settings = SandboxSettings(mode="none", workspace_root=tmp_path / "ws")
    legacy = legacy_objective_workspace("orgs", settings)
    assert legacy == settings.workspace_root / "orgs"  # the root of every organization's tree
    legacy.mkdir(parents=True)
    assert not adopt(legacy, objective_workspace("org-a", "orgs", settings), settings)
    assert legacy.is_dir()
    # `.jobs` and `.agent-jobs` were never objective directories: such ids were digests.
    assert legacy_objective_workspace(".jobs", settings).name.startswith("%")


class Died(BaseException):
    """The worker killed at this point (SIGKILL, an OOM kill): nothing after it runs."""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to the sandbox's uid")
def test_a_move_cut_off_before_its_files_were_given_is_given_by_the_next_turn(
    workspace_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`adopt` renamed the earlier workspace into place and then gave its files to the new
    path's uid: a worker that died (or a chown that failed) between the two left the workspace
    in place with its files still the old uid's, and every later turn found it there (nothing
    to move) and never gave them — the sandbox's uid could not write its own files for good."""
    root = workspace_root / f"unit-{uuid.uuid4().hex[:8]}"
    settings = SandboxSettings(workspace_root=root, uids=(50_000, 50_009))
    legacy = legacy_objective_workspace("cutoff", settings)
    prepare_workspace(legacy, settings)
    (legacy / "sub").mkdir()
    (legacy / "sub" / "file").write_text("x")
    target = objective_workspace("org-a", "cutoff", settings)
    uid = uid_for(target, settings)
    try:
        import activities.workspaces as workspaces_module

        given = workspaces_module._chown_tree
        calls = 0

        def dies_once(top: Path, to: int) -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise Died
            given(top, to)

        monkeypatch.setattr(workspaces_module, "_chown_tree", dies_once)
        # Whichever step of the move the worker dies at, the next turn's initialisation
        # (adopt, then prepare) leaves every file the new path's uid.
        with pytest.raises(Died):
            adopt(legacy, target, settings)
        adopt(legacy, target, settings)
        prepare_workspace(target, settings)
        assert target.is_dir()
        owners = {p.lstat().st_uid for p in [target, *target.rglob("*")]}
        assert owners == {uid}
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)


def test_a_parent_made_just_before_the_worker_died_is_not_left_listable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`_make_parents` made each missing directory and then set its mode (0711: the sandbox's
    uids traverse it, never list it): a worker that died between the two left it at the umask's
    0755, and every later call found it there and never set it."""
    settings = SandboxSettings(mode="none", workspace_root=tmp_path / "ws")
    workspace = objective_workspace("org-a", "release", settings)
    settings.workspace_root.mkdir(mode=0o711)
    real_chmod = Path.chmod
    calls = 0

    def dies_once(self: Path, mode: int, **kwargs: object) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise Died
        real_chmod(self, mode)

    monkeypatch.setattr(Path, "chmod", dies_once)
    with contextlib.suppress(Died):  # a worker that makes them 0711 at once never gets here
        prepare_workspace(workspace, settings)
    monkeypatch.setattr(Path, "chmod", real_chmod)
    prepare_workspace(workspace, settings)
    parents = (workspace.parent, workspace.parent.parent, workspace.parent.parent.parent)
    for parent in parents:
        assert parent.stat().st_mode & 0o777 == 0o711, parent
    # And one an earlier worker left so (cut off between its mkdir and its chmod) is mended.
    parents[0].chmod(0o755)
    prepare_workspace(workspace, settings)
    assert parents[0].stat().st_mode & 0o777 == 0o711
