"""The sandbox's policy as pure functions: environment, cwd, workspaces, uids, the command line."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from activities.gateway_providers import key_variables
from activities.sandbox_env import chain_env, clean_env, environment_args
from activities.sandbox_policy import (
    INSIDE_UID,
    Limits,
    SandboxRefused,
    SandboxSettings,
    check_executable,
    command_line,
    limit_args,
    resolve_cwd,
)
from roles.cli.up import role_env

SETTINGS = SandboxSettings(workspace_root=Path("/srv/ws"), uids=(50_000, 50_009))
WORKSPACE = Path("/srv/ws/.jobs/j1")


def test_the_environment_is_the_allow_list_plus_the_payloads() -> None:
    env = clean_env({"FOO": "bar"}, workspace=WORKSPACE, settings=SETTINGS)
    assert env == {
        "PATH": SETTINGS.path,
        "HOME": str(WORKSPACE),
        "LANG": "C.UTF-8",
        "FOO": "bar",
    }
    with_tz = clean_env(None, workspace=WORKSPACE, settings=SandboxSettings(tz="Europe/Paris"))
    assert with_tz["TZ"] == "Europe/Paris"


@pytest.mark.parametrize(
    "key",
    [
        "PATH",
        "HOME",
        "LANG",
        "TZ",
        "LD_PRELOAD",
        "LD_AUDIT",
        "ld_preload",
        "PYTHONSTARTUP",
        "PYTHONPATH",
        "RECEIPT_DATABASE_URL",
        "RECEIPT_X",
        "A=B",
        "1X",
        "",
    ],
)
def test_keys_that_would_override_or_hijack_are_refused_by_name(key: str) -> None:
    with pytest.raises(SandboxRefused, match=repr(key).replace("[", r"\[")):
        clean_env({key: "x"}, workspace=WORKSPACE, settings=SETTINGS)


def test_settings_from_the_environment() -> None:
    settings = SandboxSettings.load(
        {
            "RECEIPT_WORKSPACE_ROOT": "/var/lib/receipt/ws",
            "RECEIPT_SANDBOX_EGRESS_AGENTS": "codex, factory",
            "RECEIPT_SANDBOX_UIDS": "60000-60099",
            "RECEIPT_SANDBOX_RO_BINDS": "/opt/tools:/nix",
            "RECEIPT_SANDBOX_PROCESSES": "64",
        }
    )
    assert settings.mode == "bwrap"
    assert settings.workspace_root == Path("/var/lib/receipt/ws")
    assert settings.egress_agents == {"codex", "factory"}
    assert settings.uids == (60_000, 60_099)
    assert settings.ro_binds == ("/opt/tools", "/nix")
    assert settings.limits == Limits(processes=64)
    default = SandboxSettings.load({"RECEIPT_DATA_DIR": "/data"})
    assert default.workspace_root == Path("/data/workspaces")
    assert SandboxSettings().workspace_root == Path(".receipt/workspaces").absolute()


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"RECEIPT_SANDBOX_MEMORY_MB": "0"}, "RECEIPT_SANDBOX_MEMORY_MB"),
        ({"RECEIPT_SANDBOX_CPU_SECONDS": "1h"}, "RECEIPT_SANDBOX_CPU_SECONDS"),
        ({"RECEIPT_SANDBOX_UIDS": "9-1"}, "RECEIPT_SANDBOX_UIDS"),
        ({"RECEIPT_SANDBOX_RO_BINDS": "opt"}, "RECEIPT_SANDBOX_RO_BINDS"),
    ],
)
def test_bad_settings_are_refused_by_name(env: dict[str, str], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        SandboxSettings.load(env)


def line(**overrides: object) -> list[str]:
    kwargs: dict[str, object] = {
        "workspace": WORKSPACE,
        "cwd": WORKSPACE / "sub",
        "network": False,
        "settings": SETTINGS,
        "uid": 50_003,
        "limits": Limits(),
        "bwrap": "/opt/bwrap",
    }
    kwargs.update(overrides)
    return command_line(["make", "test"], **kwargs)  # type: ignore[arg-type]


def test_the_command_line_drops_to_the_uid_limits_then_confines() -> None:
    argv = line()
    setpriv_end = argv.index("--")
    assert argv[:setpriv_end] == [
        "/usr/bin/setpriv",
        "--reuid=50003",
        "--regid=50003",
        "--clear-groups",
        "--no-new-privs",
        "--pdeathsig=KILL",
    ]
    assert argv[setpriv_end + 1 : setpriv_end + 4] == ["/usr/bin/nice", "-n", "10"]
    assert argv[setpriv_end + 4] == "/usr/bin/prlimit"
    bwrap_at = argv.index("/opt/bwrap")
    assert argv[setpriv_end + 5 : bwrap_at - 1] == limit_args(Limits())
    options = argv[bwrap_at:]
    assert options[-3:] == ["--", "make", "test"]
    for flag in ("--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts"):
        assert flag in options
    for flag in ("--unshare-net", "--die-with-parent", "--new-session", "--disable-userns"):
        assert flag in options
    assert options[options.index("--uid") + 1] == str(INSIDE_UID)
    binds = [options[i + 1] for i, o in enumerate(options) if o == "--bind"]
    assert binds == [str(WORKSPACE)]  # the only writable bind
    assert options[options.index("--chdir") + 1] == str(WORKSPACE / "sub")
    assert options[options.index("--tmpfs") + 1] == "/tmp"


def test_commands_run_niced_unless_the_setting_is_zero() -> None:
    assert "/usr/bin/nice" not in line(settings=SETTINGS.model_copy(update={"nice": 0}))
    assert line(settings=SETTINGS.model_copy(update={"nice": 19}))[7:10] == [
        "/usr/bin/nice",
        "-n",
        "19",
    ]


def test_egress_shares_the_network_and_a_non_root_worker_keeps_its_uid() -> None:
    assert "--unshare-net" not in line(network=True)
    assert not any(part.startswith("--reuid") for part in line(uid=None))


def test_none_mode_keeps_limits_and_no_new_privileges_but_no_bwrap() -> None:
    argv = line(bwrap=None, uid=None)
    assert argv[-2:] == ["make", "test"]
    assert "/usr/bin/prlimit" in argv and "--no-new-privs" in argv
    assert not any("bwrap" in part or part.startswith("--unshare") for part in argv)


def test_the_commands_environment_is_set_for_it_alone() -> None:
    """setpriv (root on a root worker), nice and prlimit read the locale variables: a tenant's
    LOCPATH or GCONV_PATH reached them. The chain runs with PATH alone; bwrap sets the
    command's environment from a descriptor (`--args`), `none` mode with `env -i` after them."""
    env = clean_env({"LOCPATH": "/srv/ws/.jobs/j1/loc"}, workspace=WORKSPACE, settings=SETTINGS)
    assert chain_env(SETTINGS) == {"PATH": SETTINGS.path}
    confined = line(env_fd=9)
    bwrap_at = confined.index("/opt/bwrap")
    assert confined[bwrap_at + 1 : bwrap_at + 3] == ["--args", "9"]
    assert not any("LOCPATH" in part for part in confined)  # off the command line
    assert environment_args(env).split(b"\0")[:3] == [b"--clearenv", b"--setenv", b"PATH"]
    assert b"LOCPATH\0/srv/ws/.jobs/j1/loc\0" in environment_args(env)
    unconfined = line(bwrap=None, uid=None, env=env)
    env_at = unconfined.index("/usr/bin/env")
    assert unconfined.index("/usr/bin/prlimit") < env_at
    assert unconfined[env_at + 1 : env_at + 3] == ["-i", "--"]
    assert "LOCPATH=/srv/ws/.jobs/j1/loc" in unconfined[env_at:]


def test_limits_are_soft_and_hard_rlimits() -> None:
    assert limit_args(Limits(memory_mb=2, processes=3, file_size_mb=4, cpu_seconds=5)) == [
        f"--data={2 * 1024 * 1024}",
        "--nproc=3",
        f"--fsize={4 * 1024 * 1024}",
        "--cpu=5",
        "--nofile=1024",
        "--core=0",
    ]


ENV = {
    "PATH": "/usr/bin",
    "RECEIPT_DATABASE_URL": "postgresql://u:pw@db/receipt",
    "RECEIPT_API_TOKENS": "admin-token",
    "RECEIPT_API_TOKENS_FILE": "/secrets/tokens.json",
    "RECEIPT_API_TOKEN": "cli-token",
    "RECEIPT_CALLBACK_TOKEN": "cb",
    "RECEIPT_CALLBACK_SIGNING_SECRET": "whsec",
}


def test_receipt_up_gives_each_role_only_the_secrets_it_uses() -> None:
    codex = role_env("worker-codex", ENV)
    assert codex == {"PATH": "/usr/bin", "RECEIPT_DATABASE_URL": ENV["RECEIPT_DATABASE_URL"]}
    api = role_env("api", ENV)
    assert api["RECEIPT_API_TOKENS"] == "admin-token" and "RECEIPT_API_TOKEN" not in api
    driver = role_env("driver", ENV)
    assert "RECEIPT_API_TOKENS" not in driver and driver["RECEIPT_CALLBACK_SIGNING_SECRET"]
    for role in ("api", "worker-chat", "worker-control"):  # only the driver posts callbacks
        assert "RECEIPT_CALLBACK_SIGNING_SECRET" not in role_env(role, ENV), role
        assert "RECEIPT_CALLBACK_TOKEN" not in role_env(role, ENV), role
    assert role_env("temporal", ENV) == {"PATH": "/usr/bin"}


def test_receipt_up_gives_the_providers_keys_to_worker_codex_alone(tmp_path: Path) -> None:
    """The variables a providers file reads its model keys from (`OPENAI_API_KEY`: not a
    RECEIPT_ setting) reached every role and the Temporal dev server; worker-codex's gateway
    is the only process that uses them."""
    providers = tmp_path / "providers.yaml"
    providers.write_text(
        "providers:\n"
        "  - id: openai\n"
        "    api: openai\n"
        "    baseUrl: https://api.openai.com/v1\n"
        "    credentials:\n"
        "      - {id: main, env: OPENAI_API_KEY}\n"
        "      - {id: spare, file: /secrets/spare}\n"
    )
    keys = key_variables(providers)
    assert keys == {"OPENAI_API_KEY"}
    env = {**ENV, "OPENAI_API_KEY": "sk-live"}
    assert role_env("worker-codex", env, keys)["OPENAI_API_KEY"] == "sk-live"
    for role in ("api", "driver", "worker-chat", "worker-control", "temporal"):
        assert "OPENAI_API_KEY" not in role_env(role, env, keys), role
    assert key_variables(None) == set() and key_variables(tmp_path / "missing.yaml") == set()


# --- a workspace a command changes while the worker looks at it -------------------------------


def swapped_after_resolving(monkeypatch: pytest.MonkeyPatch, name: Path, host: Path) -> None:
    """`name` turns into a symbolic link to `host` just after the worker resolved it: what
    another command of the same workspace (an objective's tasks share one) swapping names in a
    loop does between the worker's two looks."""
    original = os.path.realpath

    def realpath(path: Any, *args: Any, **kwargs: Any) -> str:
        real = original(path, *args, **kwargs)
        if Path(path) == name and not name.is_symlink():
            name.rename(name.with_name(f"{name.name}.before"))
            name.symlink_to(host)
        return real

    monkeypatch.setattr(os.path, "realpath", realpath)


@pytest.mark.parametrize("host_has_it", [True, False])
def test_a_program_turned_into_a_link_after_its_check_tells_nothing_of_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host_has_it: bool
) -> None:
    """A root worker looked at the host path the link leads to: the command started when the
    host had an executable there and was refused otherwise, which told the tenant which."""
    workspace, host = tmp_path / "workspace", tmp_path / "host"
    workspace.mkdir()
    host.mkdir(mode=0o700)
    if host_has_it:
        (host / "tool").write_text("#!/bin/sh\n")
        (host / "tool").chmod(0o755)
    (workspace / "run").write_text("#!/bin/sh\n")
    (workspace / "run").chmod(0o755)
    swapped_after_resolving(monkeypatch, workspace / "run", host / "tool")
    with pytest.raises(SandboxRefused, match="no executable file at"):
        check_executable("./run", cwd=workspace, env={}, roots=(str(workspace),))


@pytest.mark.parametrize("host_has_it", [True, False])
def test_a_cwd_turned_into_a_link_after_its_check_tells_nothing_of_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host_has_it: bool
) -> None:
    workspace, host = tmp_path / "workspace", tmp_path / "host"
    (workspace / "src").mkdir(parents=True)
    host.mkdir(mode=0o700)
    if host_has_it:
        (host / "private").mkdir()
    swapped_after_resolving(monkeypatch, workspace / "src", host / "private")
    with pytest.raises(SandboxRefused, match="is not a directory in the workspace"):
        resolve_cwd(workspace, "src")


def test_a_path_that_changes_while_it_is_resolved_is_refused_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """realpath raises EINVAL when a name stops being a link between its two looks at it: the
    command is refused (never retried), not the handler failed with an OSError."""
    (tmp_path / "src").mkdir()
    original = os.path.realpath

    def realpath(path: Any, *args: Any, **kwargs: Any) -> str:
        if Path(path).name == "src":
            raise OSError(errno.EINVAL, "Invalid argument", str(path))
        return original(path, *args, **kwargs)

    monkeypatch.setattr(os.path, "realpath", realpath)
    with pytest.raises(SandboxRefused, match="outside"):
        resolve_cwd(tmp_path, "src")
    with pytest.raises(SandboxRefused, match="outside the sandbox"):
        check_executable("./src", cwd=tmp_path, env={}, roots=(str(tmp_path),))
