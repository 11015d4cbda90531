"""Console sessions: stored server-side, named by a random cookie; who they sign in as and the
CSRF token of their forms."""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar
from urllib.parse import parse_qs, urlencode, urlsplit

from fastapi import Request

from receipts import console_sessions, metrics
from receipts.errors import InvalidInput
from receipts.store import Store
from receipts.text import check_clean_text
from roles.api.auth import JOBS_READ, OPEN, Principal, token_digest
from roles.api.deps import check_open_request
from roles.api.limits import SESSIONS_BURST, OrgLimits, refusals

log = logging.getLogger("roles.api.console")

COOKIE = "receipt_console"
COOKIE_PATH = "/console"
MAX_FORM_BYTES = 64 * 1024
# In open mode (no tokens, loopback only) there is no sign-in, so no session to hold a CSRF
# token; one secret per process signs the forms instead.
_OPEN_SECRET = secrets.token_bytes(32)
# Refused sign-ins per client address: 10 at once, then one every 6 s (a guessed token costs
# the guesser time, an operator who mistyped a few does not notice). Per api process.
SIGN_IN_RATE_PER_S = 1 / 6
SIGN_IN_BURST = 10
_sign_ins = OrgLimits(SIGN_IN_RATE_PER_S, SIGN_IN_BURST)


class Owned(Protocol):
    """Something an organization owns (an objective, an agent job)."""

    @property
    def organization_id(self) -> str | None: ...


T = TypeVar("T", bound=Owned)


class SignInRequired(Exception):
    """The request has no valid console session: the page redirects to the sign-in form."""


class FormError(Exception):
    """A console form was refused (bad CSRF token, oversized or malformed body)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class Session:
    """A signed-in operator: the token's principal and the CSRF token its forms carry."""

    principal: Principal
    csrf: str
    open_mode: bool = False

    def sees(self, thing: T | None) -> T | None:
        """`thing` when this operator may see it (its organization's, or any for admin)."""
        return thing if thing is not None and self.principal.sees(thing.organization_id) else None

    @property
    def who(self) -> str:
        """How the header names the operator."""
        if self.open_mode:
            return "open mode (no tokens)"
        if self.principal.admin:
            return "admin"
        return f"organization {self.principal.organization_id}"


def csrf_for_open_mode() -> str:
    """The CSRF token of the open-mode console (no sign-in, so no session to hold one)."""
    return hmac.new(_OPEN_SECRET, b"receipt-console-csrf", hashlib.sha256).hexdigest()


async def start_session(request: Request, token: str) -> str:
    """Store a new session of `token` (signed in already) and return its id, the cookie's
    value (receipts/console_sessions.py)."""
    api = request.app.state.api
    return await console_sessions.create(
        api.require_store(),
        token_digest(token),
        ttl_s=api.settings.console_session_ttl_s,
        idle_s=api.settings.console_session_idle_s,
    )


async def end_session(request: Request) -> None:
    """Sign-out: delete the request's session row, so its cookie is refused from now on."""
    session_id = request.cookies.get(COOKIE)
    if session_id:
        await console_sessions.delete(request.app.state.api.require_store(), session_id)


def _refused(request: Request, reason: str) -> SignInRequired:
    metrics.CONSOLE_SESSIONS_REFUSED.labels(reason).inc()
    log.info(
        "console session refused",
        extra={"event": "console.session_refused", "reason": reason, "path": request.url.path},
    )
    return SignInRequired()


async def session_of(request: Request, *, reading: bool = True, touch: bool = True) -> Session:
    """Return the request's console session, or raise `SignInRequired`.

    The cookie's id must name a stored session that is neither past its absolute expiry nor
    idle past `RECEIPT_CONSOLE_SESSION_IDLE_S` (each use restarts that clock); the principal is
    the one the configured tokens give the session's token now, so a token taken out of the
    configuration ends its sessions at the api's next start. An ended session's row is
    deleted when it is refused: it never comes back. `reading` (every page): its token must
    hold `jobs:read` (sign-out need not). Not `touch` (what a page polls on its own): the idle
    clock is not restarted, so a tab left open still idles out."""
    api = request.app.state.api
    tokens = api.tokens
    if tokens.open:
        # A rebound DNS name or another origin must not reach an open console.
        check_open_request(request, json_body=False)
        return Session(OPEN, csrf_for_open_mode(), open_mode=True)
    session_id = request.cookies.get(COOKIE)
    if not session_id:
        raise SignInRequired
    store = api.require_store()
    found = await console_sessions.use(
        store, session_id, idle_s=api.settings.console_session_idle_s, touch=touch
    )
    if isinstance(found, str):
        raise _refused(request, found)
    principal = tokens.authenticate_digest(found.token_digest)
    if principal is None:
        await console_sessions.delete(store, session_id)
        raise _refused(request, "revoked_token")
    if reading and not principal.can(JOBS_READ):
        # Every page shows jobs: a token the API would not let read them reads nothing here.
        raise FormError(403, f"this token lacks the {JOBS_READ!r} scope the console reads with")
    return Session(principal, found.csrf)


def session_alive(request: Request, store: Store) -> Callable[[], Awaitable[bool]] | None:
    """What an open console stream asks while it streams: whether the cookie's session still
    stands (signed out, expired or idle, the stream ends; the README's promise that a copy of
    the cookie no longer works holds for a stream opened with it too). None in open mode."""
    session_id = request.cookies.get(COOKIE)
    if session_id is None:
        return None
    idle_s = request.app.state.api.settings.console_session_idle_s

    async def alive() -> bool:
        return await console_sessions.live(store, session_id, idle_s=idle_s)

    return alive


def check_sign_in(request: Request) -> None:
    """Refuse a sign-in another site's page made (login CSRF: it would sign the operator in as
    the attacker's organization) and one from a client past its budget of refused sign-ins
    (guessing tokens)."""
    site = request.headers.get("sec-fetch-site")
    origin = request.headers.get("origin")
    if site is not None:
        foreign = site not in ("same-origin", "none")
    else:  # an older browser: its Origin names the page that posted
        foreign = origin is not None and (
            origin == "null"
            or urlsplit(origin).netloc.lower() != request.headers.get("host", "").lower()
        )
    if foreign:
        metrics.CONSOLE_SESSIONS_REFUSED.labels("cross_site_sign_in").inc()
        log.warning(
            "console sign-in from another site refused",
            extra={"event": "console.sign_in_refused", "reason": "cross_site", "origin": origin},
        )
        raise FormError(403, "sign in from the console's own page")
    wait_s = _sign_ins.wait(_client(request))
    if wait_s > 0:
        metrics.API_LIMITED.labels("console_sign_in").inc()
        if (unlogged := refusals.due("console_sign_in", _client(request))) is not None:
            log.warning(
                "console sign-in rate limited",
                extra={"event": "console.sign_in_limited", "unloggedSince": unlogged},
            )
        raise FormError(429, f"too many refused sign-ins from this address: wait {wait_s:.0f} s")


def check_new_session(request: Request, principal: Principal) -> None:
    """Take one of the sessions `principal`'s token may make (`SESSIONS_BURST`, then one every
    6 s), or refuse the sign-in (429): each is a row until it idles out."""
    wait_s = request.app.state.api.sessions_made.take(principal.token_id)
    if wait_s > 0:
        metrics.API_LIMITED.labels("console_sessions").inc()
        if (unlogged := refusals.due("console_sessions", principal.token_id)) is not None:
            log.warning(
                "console sign-in refused: the token's sessions",
                extra={
                    "event": "console.sessions_limited",
                    "tokenId": principal.token_id,
                    "unloggedSince": unlogged,
                },
            )
        raise FormError(
            429, f"this token signed in {SESSIONS_BURST} times lately: wait {wait_s:.0f} s"
        )


def sign_in_refused(request: Request) -> None:
    """Count a refused sign-in against its client's budget (`check_sign_in`)."""
    _sign_ins.take(_client(request))


def _client(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def notice_query(session: Session, text: str) -> str:
    """The query of a page's notice after an action: `notice=<text>&ns=<tag>`. A page shows a
    notice only with the tag its own session makes, so a link from elsewhere cannot put its
    words on an operator's page ("session expired: enter your token at ...")."""
    return urlencode({"notice": text, "ns": _notice_tag(session, text)})


def notice_of(request: Request, session: Session) -> str | None:
    """The page's notice, when its tag is this session's (else none is shown)."""
    text, tag = request.query_params.get("notice"), request.query_params.get("ns")
    if text is None or tag is None:
        return None
    return text if hmac.compare_digest(tag.encode(), _notice_tag(session, text).encode()) else None


def _notice_tag(session: Session, text: str) -> str:
    key = session.csrf.encode()
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()[:32]


def need(session: Session, scope: str) -> None:
    """Refuse a console action (403) unless the session's token holds `scope`."""
    if not session.principal.can(scope):
        raise FormError(403, f"this token lacks the {scope!r} scope")


async def read_form(request: Request, session: Session | None) -> dict[str, str]:
    """Read a url-encoded form (bounded), check its CSRF token when signed in; return its fields."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise FormError(413, f"the form is larger than {MAX_FORM_BYTES} bytes")
    content_type = request.headers.get("content-type", "").split(";")[0].strip()
    if content_type != "application/x-www-form-urlencoded":
        raise FormError(415, "forms must be application/x-www-form-urlencoded")
    try:
        fields = {k: v[-1] for k, v in parse_qs(body.decode(), keep_blank_values=True).items()}
    except UnicodeDecodeError as exc:
        raise FormError(400, "the form is not UTF-8") from exc
    # Bytes, not str: compare_digest refuses a str that is not ASCII (a 500, not a 403).
    given = fields.get("csrf", "").encode()
    if session is not None and not hmac.compare_digest(given, session.csrf.encode()):
        raise FormError(403, "the form's CSRF token is missing or wrong: reload the page")
    try:
        check_clean_text(fields, "")
    except InvalidInput as exc:  # PostgreSQL stores no NUL: refused as the API refuses it
        raise FormError(422, exc.message) from exc
    return fields


async def form_of(request: Request, scope: str) -> tuple[Session, dict[str, str]]:
    """A console action's session and form fields: the form read and its CSRF token checked,
    then `scope` required of the session's token (403)."""
    session = await session_of(request)
    fields = await read_form(request, session)
    need(session, scope)
    return session, fields


class PageMissing(Exception):
    """A page or form names something that does not exist or the operator may not see: the
    console answers its 404 page naming `what` (another organization's looks like none)."""

    def __init__(self, session: Session, what: str) -> None:
        super().__init__(what)
        self.session = session
        self.what = what


def visible(session: Session, thing: T | None, what: str) -> T:
    """`thing` when the operator may see it; else `PageMissing` naming `what`."""
    found = session.sees(thing)
    if found is None:
        raise PageMissing(session, what)
    return found
