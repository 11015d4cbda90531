"""The README's quick start, as written: `make up` in a scratch checkout with nothing set, then
every `sh` block of "From `make up` to a finished job", in order, in one shell, then every
`python` block of "Call Receipt from Python" and "Write your own agent" with the checkout's
Python and the token the quick start exported, then, in the same shell, every other `sh` block
of the README in order (administration, retention, the HTTP API and the CLI, retry, objectives,
schedules), except the few marked `<!-- not run: <reason> -->` just before them (a server in the
foreground, a receiver's URL that resolves nowhere).

The scratch directory holds links to this checkout's virtualenv and Makefile inputs, so `make up`
finds everything installed and starts the stack exactly as a newcomer's would: an embedded
PostgreSQL and a Temporal dev server under `./.receipt`, the admin token it writes there, the
five roles, the examples. The stack takes the README's own ports (8000, 7233, 8233, 9471-9474).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

SECTION = "## From `make up` to a finished job"
PORTS = (8000, 7233, 8233, 9471, 9472, 9473, 9474)
UP_TIMEOUT_S = 180
SCRIPT_TIMEOUT_S = 300


PYTHON_SECTIONS = ("## Call Receipt from Python", "## Write your own agent")
# A block the README says is not for running: this comment just before it, with its reason.
NOT_RUN = re.compile(r"<!-- not run: (.+) -->", flags=re.DOTALL)
SH_BLOCK = re.compile(r"```sh\n(.*?)```", flags=re.DOTALL)


def blocks(readme: str, section: str, language: str) -> list[str]:
    """The `language` blocks of `section`, in order."""
    start = readme.index(section)
    end = readme.index("\n## ", start + len(section))
    return re.findall(rf"```{language}\n(.*?)```", readme[start:end], flags=re.DOTALL)


def quick_start_blocks(readme: str) -> list[str]:
    """The `sh` blocks of the quick-start section, in order."""
    return blocks(readme, SECTION, "sh")


def other_blocks(readme: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The `sh` blocks outside the quick-start section, in order, as (section, block): those
    to run, and those marked `not run` (with the reason in place of the block)."""
    runs: list[tuple[str, str]] = []
    skipped: list[tuple[str, str]] = []
    sections = re.split(r"\n(?=## )", readme)
    for section in sections:
        title = section.splitlines()[0]
        if title == SECTION:
            continue
        for match in SH_BLOCK.finditer(section):
            before = section[: match.start()].rstrip()
            comment = before[before.rfind("<!--") :] if before.endswith("-->") else ""
            marked = NOT_RUN.fullmatch(comment)
            if marked:
                skipped.append((title, " ".join(marked.group(1).split())))
            else:
                runs.append((title, match.group(1)))
    return runs, skipped


def python_blocks(readme: str) -> list[str]:
    """The `python` blocks of the sections on the client and the handler SDK, in order."""
    return [block for section in PYTHON_SECTIONS for block in blocks(readme, section, "python")]


def test_the_quick_start_has_the_blocks_a_newcomer_runs() -> None:
    sh = quick_start_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    text = "\n".join(sh)
    assert len(sh) >= 4
    assert "$(cat .receipt/api-token)" in sh[0]  # the token `make up` wrote
    assert "ReceiptJobId='hello-1'" in text  # the id the caller chose finds the delivery
    assert "agent-jobs create demo" in text and "objectives run" in text
    python = python_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(python) >= 4 and "from receipt_client import Client" in python[0]
    assert any("@handler(" in block for block in python)


def test_every_other_sh_block_runs_unless_marked_with_its_reason() -> None:
    """The README's other shell blocks are run too (below); the few it marks `not run` each say
    why, and the sections a newcomer types through are among those that run."""
    runs, skipped = other_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    ran = {title for title, _ in runs}
    for section in (
        "## Administration",
        "## Retention",
        "## HTTP API and the `receipt` CLI",
        "## Operator console: `/console`",
        "## Objectives: from a file to its audit",
        "## Schedules: recurring jobs",
    ):
        assert section in ran, section
    assert len(skipped) <= 3, skipped
    assert all(len(reason) > 20 for _, reason in skipped), skipped


def busy(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def clean_env() -> dict[str, str]:
    """The environment of a newcomer's shell: nothing of Receipt set."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("RECEIPT_", "PYTEST", "JOB_LEASE", "CODEX_", "FACTORY_"))
    }
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def checkout() -> Iterator[Path]:
    """A scratch directory that `make up` runs in as in a fresh checkout (traversable by the
    sandbox's uids, as a home directory under /home would be)."""
    scratch = Path(tempfile.mkdtemp(prefix="receipt-readme-"))
    scratch.chmod(0o755)
    for name in (".venv", "pyproject.toml", "requirements-dev.lock", "Makefile"):
        (scratch / name).symlink_to(ROOT / name)
    yield scratch
    shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture
def make_up(checkout: Path) -> Iterator[subprocess.Popen[bytes]]:
    taken = [port for port in PORTS if busy(port)]
    if taken:
        pytest.fail(f"the README's ports are taken, so its quick start cannot run: {taken}")
    log = (checkout / "make-up.log").open("wb")
    # `-o .venv/.installed`: the scratch shares this checkout's virtualenv, which `make test`
    # installed; never install into it from the scratch (it holds no project to install).
    process = subprocess.Popen(
        ["make", "-o", ".venv/.installed", "up"],
        cwd=checkout,
        env=clean_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_until_up(process, checkout)
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the roles, then Temporal, stop
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        log.close()


def up_log(checkout: Path) -> str:
    return (checkout / "make-up.log").read_text(errors="replace")


def wait_until_up(process: subprocess.Popen[bytes], checkout: Path) -> None:
    """Until the api answers and every role's /readyz says ready (or `make up` exits)."""
    deadline = time.monotonic() + UP_TIMEOUT_S
    urls = ["http://127.0.0.1:8000/readyz"] + [
        f"http://127.0.0.1:{port}/readyz" for port in PORTS[3:]
    ]
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"make up exited {process.returncode}:\n{up_log(checkout)[-6000:]}")
        try:
            if all(httpx.get(url, timeout=2).status_code == 200 for url in urls):
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    pytest.fail(f"make up did not come up in {UP_TIMEOUT_S} s:\n{up_log(checkout)[-6000:]}")


def test_the_readme_quick_start_runs_as_written_against_make_up(
    checkout: Path, make_up: subprocess.Popen[bytes]
) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    script = "set -euo pipefail\n" + "\n".join(quick_start_blocks(readme))
    for n, block in enumerate(python_blocks(readme)):
        (checkout / f"readme-{n}.py").write_text(block, encoding="utf-8")
        script += f"\n.venv/bin/python readme-{n}.py"
    runs, _ = other_blocks(readme)
    for n, (title, block) in enumerate(runs):
        # A marker before each block: a failure names the block that stopped the script.
        script += f"\necho '### README block {n}: {title.removeprefix('## ')}'\n" + block
    script += "\necho '### README: every block ran'"
    try:
        ran = subprocess.run(
            ["bash", "-c", script],
            cwd=checkout,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=SCRIPT_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the quick start hung:\n{exc.stdout}\n{exc.stderr}\n{up_log(checkout)}")
    out = ran.stdout
    assert ran.returncode == 0, f"{out}\n{ran.stderr}\n{up_log(checkout)[-8000:]}"
    assert "### README: every block ran" in out
    # `curl -sS` exits 0 on an error answer: none of the README's requests may get one.
    assert not re.search(r"\{\"error\": ?\{\"code\"", out), out
    # The job ran in the sandbox, its events ended with the terminal one.
    assert "hello from receipt" in out and "job.completed" in out
    assert "event: end" in out
    # Temporal found its delivery by the id the caller chose.
    assert "hello-1~" in out and "JobDriver" in out
    # The demo agent asked, was answered and succeeded; its owner heard both.
    assert "waiting_on_user" in out and "succeeded" in out
    assert out.count("session.wakeup") >= 2
    workspaces = checkout / ".receipt" / "workspaces" / "orgs" / "org-a"
    assert (workspaces / "jobs" / "hello-1").is_dir()
    notes = list((workspaces / "agent-jobs").glob("*/release-notes.md"))
    assert len(notes) == 1 and "Summarise this week's release" in notes[0].read_text()
    # The planned objective completed: each step of its goal a task of the coding agent.
    assert re.search(r"objective \S+ completed", out), out
    worked = list((workspaces / "objectives").glob("*/WORK.md"))
    assert len(worked) == 1 and "Group them by area" in worked[0].read_text()
    # "Call Receipt from Python": the job ran, the unknown one was refused by its field.
    assert "completed hello from python" in out and "refused: not_found jobId" in out
    # "Write your own agent": the example agent released through its three steps.
    released = next(line for line in out.splitlines() if "'released': '1.4.0'" in line)
    assert released.startswith("completed {") and "'steps': ['build', 'tag', 'publish']" in released
    # The other sections: the job the CLI waited for, the objective of the file, the schedule.
    assert re.search(r"demo-2~\S+\n\s*status\s+completed", out), out
    assert re.search(r"objective demo-diamond~\S+ completed", out), out
    assert "audited: 4/4 tasks completed" in out
    assert re.search(r"nightly-report~\S+\s+active\s+cron 0 3 \* \* mon-fri", out), out
