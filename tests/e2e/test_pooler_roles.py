"""The driver and worker-codex as processes behind a real PgBouncer in transaction mode
(tests/pgbouncer.py; skipped where it is not installed), with RECEIPT_DATABASE_DIRECT_URL
beside it: a job runs as soon as it is enqueued. Before, the LISTEN connection went through the
pooler and heard nothing (the dispatcher waited for its 60 s rescan or the queued redrive), and
the pools' prepared statements failed on the pooler's other server connections."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from psycopg.conninfo import make_conninfo

from receipts.store import Store
from tests import pgbouncer
from tests.e2e.conftest import task
from tests.e2e.roles_harness import RoleProcesses, wait_for
from tests.integration.helpers import put

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not pgbouncer.installed(), reason=pgbouncer.SKIP_REASON),
]


@pytest.fixture
def pooler_port(server_url: str) -> Iterator[int]:
    with pgbouncer.pgbouncer(server_url, mode="transaction", pool_size=4) as port:
        yield port


async def test_jobs_run_at_once_behind_a_transaction_pooler_with_a_direct_url(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses], pooler_port: int
) -> None:
    store, db_url = e2e_store
    procs = roles(
        RECEIPT_DATABASE_URL=make_conninfo(db_url, port=pooler_port),
        RECEIPT_DATABASE_DIRECT_URL=db_url,
        RECEIPT_LOG_FORMAT="json",
    )
    procs.start("driver")
    procs.start("worker-codex")
    try:
        for _ in range(3):  # a few jobs: each role's statements run past psycopg's threshold
            began = time.monotonic()
            job = (await put(store, payload_extra=task("true"))).job
            done = await wait_for(store, job.job_id, ("completed",), 20)
            assert done.status == "completed"
            assert time.monotonic() - began < 15  # not the 60 s rescan
        assert not procs.logged("driver", {"listen.unheard"})
        assert "prepared statement" not in procs.logs()
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.stop_all()
