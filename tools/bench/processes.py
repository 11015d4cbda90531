"""The bench's processes: their environment, start and stop (by PID, through the product's
supervisor), and the CPU each one spends."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from roles.infra.supervisor import Supervised
from tools.bench.config import BenchError

ROOT = Path(__file__).resolve().parents[2]


def role_env(db_url: str, temporal_address: str, extra: Mapping[str, str]) -> dict[str, str]:
    """The environment of a role process: this one's without Receipt or OTLP settings, plus ours."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RECEIPT_", "OTEL_", "JOB_LEASE", "CODEX_", "FACTORY_", "PYTEST"))
    }
    env.update(
        RECEIPT_DATABASE_URL=db_url,
        RECEIPT_TEMPORAL_ADDRESS=temporal_address,
        RECEIPT_TASK_QUEUE_PREFIX="bench-",
        RECEIPT_METRICS_PORT="0",
        RECEIPT_LOG_FORMAT="json",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


@dataclass
class Processes:
    """Every process the bench started, each with a log file, stopped by PID at the end."""

    log_dir: Path
    started: dict[str, Supervised] = field(default_factory=dict)

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        process = Supervised(
            name,
            list(argv),
            dict(env) if env is not None else None,
            log_file=self.log_dir / f"{name}.log",
            cwd=ROOT,
        )
        process.start()
        self.started[name] = process

    def check(self, *names: str) -> None:
        """Raise BenchError when one of the named processes (default: all) exited."""
        for name in names or tuple(self.started):
            process = self.started.get(name)
            if process is not None and (code := process.returncode()) is not None:
                raise BenchError(
                    f"{name} exited with status {code}; see {self.log_dir / (name + '.log')}"
                )

    def pid(self, name: str) -> int:
        return self.started[name].pid

    def stop(self, name: str, grace_s: float = 15.0) -> None:
        """SIGTERM, SIGKILL after `grace_s`; then SIGKILL whatever the process had started
        (a handler's child left behind, by its PID as recorded before the stop)."""
        process = self.started.pop(name, None)
        if process is not None and process.running():
            _with_descendants(process, lambda: process.stop(grace_s))

    def kill(self, name: str) -> int:
        """SIGKILL the process and everything it started at once, as a node kills a pod; return
        the PID it had. Its name stays taken until it is started again."""
        process = self.started[name]
        _with_descendants(process, process.kill)
        return process.pid

    def stop_all(self, last: Sequence[str] = ()) -> None:
        for name in [n for n in list(self.started) if n not in last]:
            self.stop(name)
        for name in last:
            self.stop(name)


def _with_descendants(process: Supervised, end: Callable[[], None]) -> None:
    """End `process` with `end`, then SIGKILL its descendants as recorded before."""
    import psutil

    try:
        descendants = psutil.Process(process.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    end()
    for child in descendants:
        with contextlib.suppress(psutil.Error):
            child.kill()


# The suffix of the entry that counts what a process's reaped children spent: the commands a
# worker ran in its sandbox (bwrap and its helpers included), which its own CPU leaves out.
COMMANDS = " commands"


class CpuMeter:
    """CPU seconds (user + system) of named processes; PostgreSQL and Temporal count their
    live children too, and each process in `with_reaped` gets a `<name> commands` entry: the
    CPU of the children it has waited for (the kernel adds it to the parent's children
    times)."""

    def __init__(
        self,
        pids: Mapping[str, int],
        with_children: Iterable[str] = (),
        with_reaped: Iterable[str] = (),
    ) -> None:
        import psutil

        self._psutil = psutil
        self.pids = dict(pids)
        self.with_children = set(with_children)
        self.with_reaped = set(with_reaped)

    def snapshot(self) -> dict[str, float]:
        psutil = self._psutil
        out: dict[str, float] = {}
        for name, pid in self.pids.items():
            try:
                proc = psutil.Process(pid)
                own = proc.cpu_times()
                total = own.user + own.system
                children = proc.children(recursive=True) if name in self.with_children else []
                for p in children:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        t = p.cpu_times()
                        total += t.user + t.system
                out[name] = total
                if name in self.with_reaped:
                    out[name + COMMANDS] = own.children_user + own.children_system
            except psutil.NoSuchProcess:
                out[name] = 0.0
        return out

    @staticmethod
    def per_item(
        before: Mapping[str, float], after: Mapping[str, float], items: int, names: Iterable[str]
    ) -> dict[str, float]:
        wanted = set(names) | {name + COMMANDS for name in names}
        return {
            k: 1000 * (after[k] - before.get(k, 0.0)) / max(1, items) for k in after if k in wanted
        }
