"""OpenAI's Codex CLI for the tests that run a real coding agent: installed once from the npm
registry at a pinned version into a directory the sandbox may be given (and reused by later
runs), its native binary used directly (no node in the sandbox)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

VERSION = "0.171.0"
HOME = Path(f"/tmp/receipt-codex-cli-{VERSION}")
BINARY = HOME / "node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"


def installed() -> Path:
    """The codex binary, installed with npm if it is not yet (about 100 MB from the registry)."""
    if BINARY.is_file():
        return BINARY
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed: the real coding-agent test needs it (.ci/run)")
    HOME.mkdir(parents=True, exist_ok=True)
    HOME.chmod(0o755)  # the sandbox's uid reads the binary
    subprocess.run(
        [npm, "install", "--prefix", str(HOME), "--no-audit", "--no-fund", "--loglevel=error",
         f"@openai/codex@{VERSION}"],
        check=True,
        timeout=900,
    )  # fmt: skip
    if not BINARY.is_file():
        raise RuntimeError(f"npm installed @openai/codex@{VERSION} without {BINARY}")
    return BINARY
