"""Console sessions: the cookie names a session stored in PostgreSQL, not the token; expiry, idle
timeout, sign-out, CSRF per session, api restarts and several api processes, revoked tokens."""

from __future__ import annotations

import asyncio
import hashlib
import re
from pathlib import Path

import httpx
import psycopg
from prometheus_client import REGISTRY

from receipts.store import Store
from tests.integration.api_support import (
    TOKEN_A,
    TOKEN_ADMIN,
    TOKEN_B,
    api_client,
    running_api,
)
from tests.integration.helpers import new_id
from tests.integration.test_console import form, sign_in

COOKIE = "receipt_console"


def refused(reason: str) -> float:
    """How many console cookies this process refused for `reason` so far."""
    value = REGISTRY.get_sample_value("receipt_console_sessions_refused_total", {"reason": reason})
    return value or 0.0


async def session_rows(store: Store, cookie: str) -> list[tuple[bytes, bytes, str]]:
    """The stored rows whose digest is the cookie's (its id is never stored)."""
    async with store.connection() as conn:
        cur = await conn.execute(
            "SELECT session_digest, token_digest, csrf FROM console_sessions "
            "WHERE session_digest = %s",
            (hashlib.sha256(cookie.encode()).digest(),),
        )
        return [(bytes(r[0]), bytes(r[1]), r[2]) for r in await cur.fetchall()]


def set_cookie_line(answer: httpx.Response) -> str:
    return answer.headers["set-cookie"]


async def test_the_cookie_is_a_random_session_id_with_its_flags_not_the_token(
    db_url: str, store: Store
) -> None:
    async with api_client(db_url, store=store) as client:
        answer = await client.post("/console/login", **form({"token": TOKEN_A}))  # type: ignore[arg-type]
        line = set_cookie_line(answer)
        cookie = client.cookies[COOKIE]
        # Served over plain http: no Secure flag (a browser would drop the cookie).
        assert "Secure" not in line
    assert answer.status_code == 303
    for flag in ("HttpOnly", "SameSite=strict", "Path=/console", "Max-Age=43200"):
        assert flag in line, line
    assert TOKEN_A not in line and len(cookie) >= 40
    [(_, token_digest, csrf)] = await session_rows(store, cookie)
    assert token_digest == hashlib.sha256(TOKEN_A.encode()).digest()
    # Neither the id nor the token is in the database, only their digests.
    async with store.connection() as conn:
        cur = await conn.execute("SELECT * FROM console_sessions")
        stored = repr(await cur.fetchall())
    assert cookie not in stored and TOKEN_A not in stored
    assert re.fullmatch(r"[0-9a-f]{64}", csrf)
    async with api_client(db_url, store=store, base_url="https://api.test") as tls:
        answer = await tls.post("/console/login", **form({"token": TOKEN_A}))  # type: ignore[arg-type]
        assert "Secure" in set_cookie_line(answer)
        assert (await tls.get("/console/jobs")).status_code == 200
        other = tls.cookies[COOKIE]
    assert other != cookie


async def test_the_csrf_token_is_per_session_and_another_sessions_is_refused(
    db_url: str, store: Store
) -> None:
    async with (
        api_client(db_url, store=store) as first,
        api_client(db_url, store=store) as second,
    ):
        csrf_first = await sign_in(first, TOKEN_A)
        csrf_second = await sign_in(second, TOKEN_A)
        # The same token, two sessions: two CSRF tokens, stable within each session.
        assert csrf_first != csrf_second
        assert csrf_first == await sign_in_page_csrf(first)
        crossed = await second.post("/console/logout", **form({"csrf": csrf_first}))  # type: ignore[arg-type]
        assert crossed.status_code == 403 and "CSRF" in crossed.text
        assert (await second.get("/console/jobs")).status_code == 200
        own = await second.post("/console/logout", **form({"csrf": csrf_second}))  # type: ignore[arg-type]
        assert own.status_code == 303


async def sign_in_page_csrf(client: httpx.AsyncClient) -> str:
    page = await client.get("/console/jobs")
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert found, page.text
    return found.group(1)


async def test_sign_out_revokes_the_session_server_side(db_url: str, store: Store) -> None:
    async with api_client(db_url, store=store) as client:
        csrf = await sign_in(client, TOKEN_A)
        cookie = client.cookies[COOKIE]
        assert await session_rows(store, cookie)
        out = await client.post("/console/logout", **form({"csrf": csrf}))  # type: ignore[arg-type]
        assert out.status_code == 303 and out.headers["location"] == "/console/login"
        assert not await session_rows(store, cookie)
        before = refused("unknown")
        # A copy of the old cookie (a browser that kept it) no longer signs in.
        replay = await client.get("/console/jobs", headers={"Cookie": f"{COOKIE}={cookie}"})
        assert replay.status_code == 303 and replay.headers["location"] == "/console/login"
        stream = await client.get(
            "/console/jobs/x/events", headers={"Cookie": f"{COOKIE}={cookie}"}
        )
        assert stream.status_code == 401
    assert refused("unknown") == before + 2


async def test_the_absolute_expiry_ends_a_session_and_sign_in_prunes_old_ones(
    db_url: str, store: Store
) -> None:
    # Seconds, not fractions: two sign-ins and a page must fit in the TTL on a loaded machine.
    async with api_client(db_url, store=store, console_session_ttl_s=4.0) as client:
        await sign_in(client, TOKEN_A)
        used = client.cookies[COOKIE]
        client.cookies.clear()
        await sign_in(client, TOKEN_B)
        forgotten = client.cookies[COOKIE]
        client.cookies.clear()
        assert (
            await client.get("/console/jobs", headers={"Cookie": f"{COOKIE}={used}"})
        ).status_code == 200
        await asyncio.sleep(4.5)
        before = refused("expired")
        late = await client.get("/console/jobs", headers={"Cookie": f"{COOKIE}={used}"})
        assert late.status_code == 303 and late.headers["location"] == "/console/login"
        assert refused("expired") == before + 1
        assert not await session_rows(store, used)  # refused, then deleted
        # The session nobody used again goes at the next sign-in.
        assert await session_rows(store, forgotten)
        await sign_in(client, TOKEN_ADMIN)
        assert not await session_rows(store, forgotten)


async def test_the_idle_timeout_ends_a_session_each_use_restarts_it(
    db_url: str, store: Store
) -> None:
    async with api_client(db_url, store=store, console_session_idle_s=4.0) as client:
        await sign_in(client, TOKEN_A)
        cookie = client.cookies[COOKIE]
        # Used every 1.5 s, the session outlives its 4 s idle timeout (2.5 s of slack a use).
        for _ in range(4):
            await asyncio.sleep(1.5)
            assert (await client.get("/console/jobs")).status_code == 200
        await asyncio.sleep(4.5)
        before = refused("idle")
        idle = await client.get("/console/jobs")
        assert idle.status_code == 303 and idle.headers["location"] == "/console/login"
        assert refused("idle") == before + 1
        assert not await session_rows(store, cookie)


def test_a_session_survives_an_api_restart_works_on_another_api_and_ends_with_its_token(
    db_url: str, tmp_path: Path
) -> None:
    def page(url: str, cookie: str) -> httpx.Response:
        return httpx.get(
            f"{url}/console/jobs", headers={"Cookie": f"{COOKIE}={cookie}"}, timeout=10
        )

    with running_api(db_url, tmp_path) as first, running_api(db_url, tmp_path) as second:
        answer = httpx.post(
            f"{first.url}/console/login",
            content=f"token={TOKEN_A}",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert answer.status_code == 303
        cookie = answer.cookies[COOKIE]
        csrf = re.findall(r'name="csrf" value="([0-9a-f]+)"', page(first.url, cookie).text)
        # Another api process (another pod) knows the session and its CSRF token.
        on_second = page(second.url, cookie)
        assert on_second.status_code == 200 and "organization org-a" in on_second.text
        assert re.findall(r'name="csrf" value="([0-9a-f]+)"', on_second.text) == csrf
    with running_api(db_url, tmp_path) as restarted:
        again = page(restarted.url, cookie)
        assert again.status_code == 200 and "organization org-a" in again.text
    # TOKEN_A revoked: taken out of the configuration, the api restarted.
    revoked_tokens = f"{TOKEN_B} org-b\n{TOKEN_ADMIN} *"
    with running_api(db_url, tmp_path, RECEIPT_API_TOKENS=revoked_tokens) as revoked:
        gone = page(revoked.url, cookie)
        assert gone.status_code == 303 and gone.headers["location"] == "/console/login"
        log = revoked.log_text()
    assert '"event": "console.session_refused"' in log and '"reason": "revoked_token"' in log
    # The refused session was deleted: configuring the token again does not revive it.
    with psycopg.connect(db_url) as conn:
        digest = hashlib.sha256(cookie.encode()).digest()
        row = conn.execute(
            "SELECT 1 FROM console_sessions WHERE session_digest = %s", (digest,)
        ).fetchone()
    assert row is None


async def test_an_open_streams_session_check_sees_sign_out_expiry_and_idleness(
    store: Store,
) -> None:
    """What a console stream asks while it streams: a session signed out, past its expiry, or
    idle past RECEIPT_CONSOLE_SESSION_IDLE_S no longer stands (the stream ran on past an idle
    session's end, up to its hour); asking does not restart the idle clock."""
    from receipts import console_sessions

    digest = hashlib.sha256(b"a token").digest()
    standing = await console_sessions.create(store, digest, ttl_s=3600, idle_s=1800)
    assert await console_sessions.live(store, standing, idle_s=1800)
    idle = await console_sessions.create(store, digest, ttl_s=3600, idle_s=1800)
    expired = await console_sessions.create(store, digest, ttl_s=3600, idle_s=1800)
    signed_out = await console_sessions.create(store, digest, ttl_s=3600, idle_s=1800)
    async with store.connection() as conn:
        await conn.execute(
            "UPDATE console_sessions SET last_used_at = now() - interval '31 minutes' "
            "WHERE session_digest = %s",
            (hashlib.sha256(idle.encode()).digest(),),
        )
        await conn.execute(
            "UPDATE console_sessions SET expires_at = now() - interval '1 second' "
            "WHERE session_digest = %s",
            (hashlib.sha256(expired.encode()).digest(),),
        )
    await console_sessions.delete(store, signed_out)
    for ended in (idle, expired, signed_out):
        assert not await console_sessions.live(store, ended, idle_s=1800)
    async with store.connection() as conn:
        cur = await conn.execute(
            "SELECT last_used_at < now() - interval '30 minutes' FROM console_sessions "
            "WHERE session_digest = %s",
            (hashlib.sha256(idle.encode()).digest(),),
        )
        assert await cur.fetchone() == (True,)  # the check restarted no idle clock


async def test_an_objective_pages_poll_does_not_keep_its_session_from_idling_out(
    db_url: str, store: Store
) -> None:
    """The objective page polls its graph's state every second for as long as it is open (an
    objective that stays active, or whose audit never lands: for ever). Each poll restarted the
    session's idle clock, so a tab left on that page kept its session signed in until the 12 h
    expiry: RECEIPT_CONSOLE_SESSION_IDLE_S never ended it. A poll is no more the operator using
    the page than an open event stream is: it is answered, and restarts no clock."""
    from tests.integration.helpers import create_objective

    objective_id = await create_objective(store, f"o-idle-{new_id()}")
    async with api_client(db_url, store=store) as client:
        await sign_in(client, TOKEN_A)
        cookie = client.cookies[COOKIE]
        digest = hashlib.sha256(cookie.encode()).digest()
        async with store.connection() as conn:
            await conn.execute(
                "UPDATE console_sessions SET last_used_at = now() - interval '20 minutes' "
                "WHERE session_digest = %s",
                (digest,),
            )
        polled = await client.get(f"/console/objectives/{objective_id}/state")
        assert polled.status_code == 200 and polled.json()["status"] == "active"
        async with store.connection() as conn:
            cur = await conn.execute(
                "SELECT last_used_at < now() - interval '19 minutes' FROM console_sessions "
                "WHERE session_digest = %s",
                (digest,),
            )
            assert await cur.fetchone() == (True,)  # the poll restarted no idle clock
            await conn.execute(
                "UPDATE console_sessions SET last_used_at = now() - interval '31 minutes' "
                "WHERE session_digest = %s",
                (digest,),
            )
        # Idle: the poll is refused as any request is (401, so the page's script stops), and
        # the row is gone.
        ended = await client.get(f"/console/objectives/{objective_id}/state")
        assert ended.status_code == 401
        assert not await session_rows(store, cookie)
