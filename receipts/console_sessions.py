"""The operator console's sessions in PostgreSQL (migrations/0013): created at sign-in, used by
every console request, deleted at sign-out or once ended (roles/api/console/session.py).

A row keeps the SHA-256 of the cookie's random id, never the id, and the SHA-256 of the token
that signed in, never the token.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from receipts.store import Store


@dataclass(frozen=True, slots=True)
class StoredSession:
    """A live session: the digest of its token and the CSRF token of its forms."""

    token_digest: bytes
    csrf: str


def digest_of(session_id: str) -> bytes:
    """What the database keeps of a session's id: its SHA-256."""
    return hashlib.sha256(session_id.encode("utf-8")).digest()


async def create(store: Store, token_digest: bytes, *, ttl_s: float, idle_s: float) -> str:
    """Store a new session of the token whose digest is `token_digest`, expiring `ttl_s` from
    now; return its random id (the cookie's value). Every ended session (past its expiry, or
    idle `idle_s`) is deleted first, so the table holds live sessions without a loop of its own."""
    session_id = secrets.token_urlsafe(32)
    await store.fetch("console_sessions_prune", {"idle_s": idle_s})
    await store.fetch(
        "console_session_create",
        {
            "session_digest": digest_of(session_id),
            "token_digest": token_digest,
            "csrf": secrets.token_hex(32),
            "ttl_s": ttl_s,
        },
    )
    return session_id


async def use(
    store: Store, session_id: str, *, idle_s: float, touch: bool = True
) -> StoredSession | str:
    """The live session `session_id` names, its idle clock restarted (unless not `touch`: a
    page's poll is not the operator using it); else why there is none: `expired`, `idle` (the
    row is deleted then) or `unknown` (no row: never, or signed out)."""
    digest = digest_of(session_id)
    query = "console_session_use" if touch else "console_session_peek"
    row = await store.fetch_one(query, {"session_digest": digest, "idle_s": idle_s})
    if row is not None:
        return StoredSession(bytes(row[0]), str(row[1]))
    state = await store.fetch_one("console_session_state", {"session_digest": digest})
    if state is None:
        return "unknown"
    await delete(store, session_id)
    return str(state[0])


async def live(store: Store, session_id: str, *, idle_s: float) -> bool:
    """Whether the session `session_id` names still stands (not signed out, neither expired nor
    idle `idle_s`): what an open event stream of the console asks while it streams."""
    row = await store.fetch_one(
        "console_session_live", {"session_digest": digest_of(session_id), "idle_s": idle_s}
    )
    return row is not None


async def delete(store: Store, session_id: str) -> None:
    """End the session `session_id` names (sign-out, or its token revoked): its cookie is
    refused from now on."""
    await store.fetch("console_session_delete", {"session_digest": digest_of(session_id)})
