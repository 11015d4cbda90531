"""A sandboxed command's environment: what it may hold (`clean_env`), and how it reaches the
command and nothing else. The start-up chain before the command — the cgroup join's shell and
`setpriv` (root on a root worker), `nice`, `prlimit` — runs with `chain_env` only: glibc in each
of them reads the locale variables (`LOCPATH`, `LC_ALL`, `GCONV_PATH`…), and a tenant's value
pointing into its workspace steered a root process's file reads (a FIFO there hung it past the
attempt's abort). bwrap sets the command's environment from a descriptor (`--args`), which keeps
the values off every command line."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from activities.sandbox_policy import SandboxRefused, SandboxSettings

# The environment a command starts from; the payload's env may add to it, never override it.
ALLOWED_NAMES = ("PATH", "HOME", "LANG", "TZ")
FORBIDDEN_PREFIXES = ("LD_", "PYTHON", "RECEIPT_")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def clean_env(
    extra: Mapping[str, str] | None, *, workspace: Path, settings: SandboxSettings
) -> dict[str, str]:
    """The command's whole environment: PATH, HOME (= the workspace), LANG, TZ, plus `extra`.

    Raises SandboxRefused naming the first key of `extra` that would override the allow-list or
    starts with LD_, PYTHON or RECEIPT_ (loader, interpreter and Receipt settings stay ours).
    """
    env = {"PATH": settings.path, "HOME": str(workspace), "LANG": settings.lang}
    if settings.tz:
        env["TZ"] = settings.tz
    for key, value in (extra or {}).items():
        if key in ALLOWED_NAMES:
            raise SandboxRefused(f"payload.task.env may not set {key!r} (the sandbox sets it)")
        if key.upper().startswith(FORBIDDEN_PREFIXES):
            raise SandboxRefused(
                f"payload.task.env may not set {key!r}: names starting with "
                f"{', '.join(FORBIDDEN_PREFIXES)} are refused"
            )
        if not _ENV_NAME.fullmatch(key) or "\0" in value:
            raise SandboxRefused(f"payload.task.env has an invalid name or value at {key!r}")
        env[key] = value
    return env


def chain_env(settings: SandboxSettings) -> dict[str, str]:
    """The environment of the processes that start a command (not the command's): PATH only."""
    return {"PATH": settings.path}


def environment_args(env: Mapping[str, str]) -> bytes:
    """bwrap's `--clearenv --setenv NAME VALUE …` as the NUL-terminated arguments `--args`
    reads."""
    words = ["--clearenv"]
    for name, value in env.items():
        words += ["--setenv", name, value]
    return b"".join(word.encode() + b"\0" for word in words)


def environment_args_fd(env: Mapping[str, str]) -> int:
    """A descriptor (an anonymous memory file, read from its start) holding
    `environment_args(env)`, to pass to bwrap as `--args <fd>`; the caller closes it."""
    fd = os.memfd_create("receipt-sandbox-env", 0)
    try:
        os.write(fd, environment_args(env))
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd
