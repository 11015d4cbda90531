"""Run real role processes (`python -m roles.role NAME`) against a test database and Temporal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from receipts.jobs import Job
from receipts.store import Store
from roles.infra.supervisor import Supervised
from tests.eventually import eventually

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class RoleProcesses:
    """Starts, kills and restarts role processes (each through the product's supervisor, by
    PID); every process shares one environment."""

    env: dict[str, str]
    log_dir: Path
    supervised: dict[str, Supervised] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def create(
        cls, db_url: str, temporal_address: str, log_dir: Path, extra: Mapping[str, str]
    ) -> RoleProcesses:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("RECEIPT_", "PYTEST", "JOB_LEASE", "CODEX_", "FACTORY_"))
        }
        env.update(
            RECEIPT_DATABASE_URL=db_url,
            RECEIPT_TEMPORAL_ADDRESS=temporal_address,
            RECEIPT_TASK_QUEUE_PREFIX=f"e{uuid.uuid4().hex[:8]}-",
            PYTHONUNBUFFERED="1",
        )
        if "RECEIPT_WORKSPACE_ROOT" in os.environ:  # the session's (tests/conftest.py)
            env["RECEIPT_WORKSPACE_ROOT"] = os.environ["RECEIPT_WORKSPACE_ROOT"]
        env.update(extra)
        return cls(env, log_dir)

    @property
    def processes(self) -> dict[str, subprocess.Popen[bytes]]:
        """The current process of every name."""
        return {n: s.process for n, s in self.supervised.items() if s.process is not None}

    def start(self, name: str, role: str | None = None) -> subprocess.Popen[bytes]:
        """Start process `name` running `role` (default: the name); log `<name>.<n>.log`."""
        count = self.restarts.get(name, -1) + 1
        self.restarts[name] = count
        process = Supervised(
            name,
            [sys.executable, "-m", "roles.role", role or name],
            dict(self.env),
            log_file=self.log_dir / f"{name}.{count}.log",
            cwd=ROOT,
        )
        self.supervised[name] = process
        return process.start()

    def signal(self, name: str, sig: signal.Signals) -> None:
        self.supervised[name].send(sig)

    def kill(self, name: str) -> None:
        self.supervised[name].kill()

    def pid_of(self, name: str) -> int:
        return self.supervised[name].pid

    def name_of(self, pid: int) -> str | None:
        return next((n for n, p in self.supervised.items() if p.pid == pid), None)

    def restart_dead(self) -> list[str]:
        """Restart every process that exited (the supervisor's job); return their names."""
        dead = [n for n, p in self.supervised.items() if p.returncode() is not None]
        for name in dead:
            self.start(name, self._role(name))
        return dead

    def _role(self, name: str) -> str:
        return name.rstrip("0123456789").rstrip("-") if name[-1].isdigit() else name

    def stop_all(self) -> None:
        for process in self.supervised.values():
            process.send(signal.SIGCONT)
            process.send(signal.SIGTERM)
        for process in self.supervised.values():
            process.stop(15)

    def logged(self, name: str, events: set[str], **fields: object) -> list[dict[str, object]]:
        """The JSON log records of process `name` (every run of it) whose `event` is one of
        `events` and which carry `fields`."""
        found = []
        for path in sorted(self.log_dir.glob(f"{name}.*.log")):
            for line in path.read_text(errors="replace").splitlines():
                if not line.startswith("{"):
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if record.get("event") in events and all(
                    record.get(k) == v for k, v in fields.items()
                ):
                    found.append(record)
        return found

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-4000:]}"
            for path in sorted(self.log_dir.glob("*.log"))
        )


async def wait_for(
    store: Store, job_id: str, statuses: tuple[str, ...], timeout: float = 60.0
) -> Job:
    """Poll until the job reaches one of `statuses`."""
    job = await eventually(
        lambda: store.get_job(job_id),
        lambda job: job is not None and job.status in statuses,
        timeout=timeout,
        every=0.1,
        what=f"{job_id} reaching {statuses}",
    )
    assert job is not None
    return job


async def holder_id(store: Store, job_id: str) -> str:
    """The worker id of the delivery holding the running job's lease."""
    job = await wait_for(store, job_id, ("running",), 60)
    assert job.lease is not None
    return job.lease.worker_id
