"""Fixtures of the role-process tests: a fresh database and a factory of role processes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from receipts import assembly
from receipts.store import Store
from tests.conftest import migrate_patiently
from tests.e2e.roles_harness import RoleProcesses


@pytest.fixture
async def e2e_store(make_database: Callable[[], str]) -> AsyncIterator[tuple[Store, str]]:
    url = make_database()
    await migrate_patiently(url)
    store = await assembly.open_store(url, min_size=1, max_size=5)
    yield store, url
    await store.close()


@pytest.fixture
def roles(
    e2e_store: tuple[Store, str], temporal_env: Any, tmp_path: Path
) -> Iterator[Callable[..., RoleProcesses]]:
    """`roles(address=None, **env)` → role processes on the session's (or another) Temporal."""
    started: list[RoleProcesses] = []

    def make(address: str | None = None, **extra: str) -> RoleProcesses:
        target = address or temporal_env.client.service_client.config.target_host
        env = {"RECEIPT_METRICS_PORT": "0", **extra}
        processes = RoleProcesses.create(e2e_store[1], target, tmp_path, env)
        started.append(processes)
        return processes

    yield make
    for processes in started:
        processes.stop_all()


def task(*argv: str) -> dict[str, Any]:
    """A codex `factory.task.run` payload running `argv`."""
    return {"task": {"command": list(argv)}}
