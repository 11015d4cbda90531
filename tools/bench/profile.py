"""Where a profiled process spent its time: py-spy recordings of the roles (`--profile`) and a
summary of their busy samples by package."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Profiler:
    """py-spy recorders attached to role processes by PID; raw collapsed stacks per phase."""

    folder: Path
    profiles: dict[str, str] = field(default_factory=dict)
    _spies: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def attach(self, pids: Mapping[str, int], phase: str) -> None:
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        self.folder.mkdir(parents=True, exist_ok=True)
        for name, pid in pids.items():
            out = self.folder / f"{phase}-{name}.txt"
            argv = [spy, "record", "--pid", str(pid), "--rate", "100"]
            argv += ["--nonblocking", "--full-filenames", "--format", "raw", "--output", str(out)]
            self._spies[name] = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            self.profiles[f"{phase}-{name}"] = str(out)

    def detach(self) -> None:
        """Stop every recorder (SIGINT makes py-spy write its file), by its PID."""
        for spy in self._spies.values():
            if spy.poll() is None:
                spy.send_signal(signal.SIGINT)
        for spy in self._spies.values():
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait(5)
        self._spies.clear()


# Innermost frames that mean "waiting", not working: (function, file name).
IDLE_FRAMES = {
    ("select", "selectors.py"),
    ("EpollSelector.select", "selectors.py"),
    ("_PollLikeSelector.select", "selectors.py"),
    ("Condition.wait", "threading.py"),
    ("Event.wait", "threading.py"),
    ("Thread._wait_for_tstate_lock", "threading.py"),
    ("Queue.get", "queue.py"),
    ("_worker", "thread.py"),
}


def _idle(frame: str) -> bool:
    if not frame.strip():
        return True  # a thread with no Python frame (the SDK's native threads)
    function, _, where = frame.rpartition(" (")
    return (function, where.rsplit(":", 1)[0].rsplit("/", 1)[-1]) in IDLE_FRAMES


def _frame_package(frame: str) -> str:
    """The package of a py-spy frame `func (path/to/file.py:12)`: `psycopg`, `receipts`,
    `stdlib:json`…"""
    _, _, where = frame.rpartition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    if path.startswith("<"):
        return "python"
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if path.startswith(f"{ROOT}/"):
        return path[len(str(ROOT)) + 1 :].split("/", 1)[0].removesuffix(".py")
    if "/lib/python3" in path:
        rest = path.split("/lib/python3", 1)[1].split("/", 2)
        return "stdlib:" + (rest[1] if len(rest) > 1 else rest[0]).removesuffix(".py")
    return path.split("/", 1)[0].removesuffix(".py")


def _function(frame: str) -> str:
    """A py-spy frame `name (path:line)` as `name (file)`: one function, whichever line ran."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({_frame_package(frame)}/{path.rsplit('/', 1)[-1]})" if path else name


def profile_summary(
    collapsed: Iterable[str], limit: int = 12
) -> dict[str, list[tuple[str, float]]]:
    """Where a process spent its busy samples, from py-spy's raw (collapsed) output.

    Samples whose innermost frame is an idle wait (the event loop's select, a thread pool's
    queue) are left out. Returns the `limit` largest shares of busy samples by package of the
    innermost frame (`self`), by innermost function (`functions`: where the CPU itself went),
    by function including callees (`inclusive`), and the busy share of all samples (`busy`).
    """
    by_package: dict[str, int] = {}
    by_function: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    busy = total = 0
    for line in collapsed:
        stack, _, count_text = line.rstrip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        if _idle(frames[-1]):
            continue
        busy += count
        package = _frame_package(frames[-1])
        by_package[package] = by_package.get(package, 0) + count
        function = _function(frames[-1])
        by_function[function] = by_function.get(function, 0) + count
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + count

    def ranked(counts: Mapping[str, int]) -> list[tuple[str, float]]:
        top = sorted(counts.items(), key=lambda kv: -kv[1])[:limit]
        return [(name, n / busy) for name, n in top] if busy else []

    return {
        "busy": [("busy", busy / total if total else 0.0)],
        "self": ranked(by_package),
        "functions": ranked(by_function),
        "inclusive": ranked(inclusive),
    }
