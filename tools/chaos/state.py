"""Everything one chaos run holds while it runs."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from receipts.store import Store
from roles.infra.supervisor import Supervised
from tools.chaos.plan import ChaosConfig, Fault


@dataclass
class Run:
    """Everything one chaos run holds."""

    config: ChaosConfig
    data_dir: Path
    env: dict[str, str]
    api_url: str
    temporal_port: int
    db_url: str
    pgdata: Path | None
    store: Store | None = None
    roles: dict[str, Supervised] = field(default_factory=dict)
    temporal: Supervised | None = None
    accepted: dict[str, str] = field(default_factory=dict)
    refused: Counter[str] = field(default_factory=Counter)
    faults: list[Fault] = field(default_factory=list)
    poison: str | None = None
    started: float = field(default_factory=time.monotonic)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    keepers: list[asyncio.Task[None]] = field(default_factory=list)
    objectives: list[str] = field(default_factory=list)
    objective_cancels: Counter[str] = field(default_factory=Counter)  # answers to cancel posts
    agent_jobs: dict[str, str] = field(default_factory=dict)  # agent job id → its prompt
    sessions: set[str] = field(default_factory=set)  # their owners' sessions
    agent_commands: Counter[str] = field(default_factory=Counter)  # steers, follow-ups accepted

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def say(self, line: str) -> None:
        print(f"[{self.elapsed():7.1f}s] {line}", flush=True)
