"""Open the store for a role: resolve the database URL (embedded by default), migrate, pool."""

from __future__ import annotations

import psycopg

from receipts.settings import Settings
from receipts.store import Store, migrate
from roles.embedded import database_url


def resolve_url(settings: Settings | None = None) -> str:
    """Return `RECEIPT_DATABASE_URL`, or start the embedded server and return its URI."""
    settings = settings or Settings()
    return database_url(settings.database_url, settings.data_dir)


async def migrate_url(url: str) -> list[int]:
    """Apply pending migrations on `url`; return the versions applied."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        return await migrate(conn)


async def open_store(url: str, settings: Settings | None = None) -> Store:
    """Open a pooled store on `url` with the configured pool size."""
    settings = settings or Settings()
    return await Store.open(url, min_size=settings.pool_min_size, max_size=settings.pool_max_size)
