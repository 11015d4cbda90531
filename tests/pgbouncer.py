"""A real PgBouncer in front of the test server, for the tests of a deployment behind a pooler
(tests/integration/test_pooler.py). Absent (`pgbouncer` not on PATH, e.g. `apt-get install
pgbouncer`), those tests skip and say so."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from roles.infra.ports import free_port, port_open

SKIP_REASON = (
    "pgbouncer is not installed (apt-get install pgbouncer): the tests of a deployment behind "
    "a transaction-mode pooler need a real one"
)


def installed() -> bool:
    return shutil.which("pgbouncer") is not None


@contextmanager
def pgbouncer(server_url: str, *, mode: str = "transaction", pool_size: int = 2) -> Iterator[int]:
    """Run PgBouncer (`pool_mode = mode`, `pool_size` server connections per database) on a
    free loopback port in front of `server_url`'s server, any database name passed through;
    yield the port. Clients are trusted; PgBouncer logs in with `server_url`'s user and
    password. Run as `nobody` when this process is root (PgBouncer refuses root)."""
    server = conninfo_to_dict(server_url)
    target = {
        "host": str(server.get("host") or "127.0.0.1"),
        "port": str(server.get("port") or "5432"),
        "user": str(server.get("user") or "postgres"),
    }
    if server.get("password"):
        target["password"] = str(server["password"])
    user = target["user"]
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="receipt-pgbouncer-"))
    folder.chmod(0o755)
    (folder / "users.txt").write_text(f'"{user}" ""\n')
    (folder / "pgbouncer.ini").write_text(
        f"""[databases]
* = {make_conninfo("", **target)}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {folder / "users.txt"}
pool_mode = {mode}
default_pool_size = {pool_size}
max_client_conn = 500
"""
    )
    for name in ("users.txt", "pgbouncer.ini"):
        (folder / name).chmod(0o644)
    log = (folder / "pgbouncer.log").open("wb")
    process = subprocess.Popen(
        ["pgbouncer", str(folder / "pgbouncer.ini")],
        stdout=log,
        stderr=subprocess.STDOUT,
        user="nobody" if os.geteuid() == 0 else None,
    )
    try:
        ends = time.monotonic() + 10
        while not port_open(port):
            if process.poll() is not None or time.monotonic() > ends:
                raise RuntimeError(
                    f"pgbouncer did not start: {(folder / 'pgbouncer.log').read_text()[-2000:]}"
                )
            time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        shutil.rmtree(folder, ignore_errors=True)
