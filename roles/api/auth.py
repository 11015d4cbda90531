"""API bearer tokens: each bound to one organization (or admin) and its scopes, compared in
constant time.

Tokens come from `RECEIPT_API_TOKENS_FILE` (a JSON document or one token per line) and/or
`RECEIPT_API_TOKENS` (the line format, entries separated by newlines or commas). Only SHA-256
digests of the tokens are kept in memory, and no token is ever logged.

Scopes (README, "Security: the API"): `jobs:read` (read jobs and their events), `jobs:write`
(enqueue, command), `commands:run` (enqueue a kind that runs commands on the codex workers, steer such a job),
`admin` (every organization, `/metrics`). A token listed without scopes keeps what tokens could
do before scopes existed: an organization token gets `jobs:read jobs:write commands:run`, a
`*` token `admin`.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ADMIN_MARKER = "*"
"""In the line format, `*` in place of an organization id marks an admin token."""


class TokenConfigError(ValueError):
    """The token configuration is unreadable or invalid, or the API may not start open."""


JOBS_READ = "jobs:read"
JOBS_WRITE = "jobs:write"
COMMANDS_RUN = "commands:run"
ADMIN = "admin"
SCOPES: tuple[str, ...] = (JOBS_READ, JOBS_WRITE, COMMANDS_RUN, ADMIN)
DEFAULT_SCOPES: frozenset[str] = frozenset({JOBS_READ, JOBS_WRITE, COMMANDS_RUN})


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request acts for: one organization, or an admin that sees every organization.

    `token_id` names the token (a digest prefix, never the token) for per-token limits.
    """

    organization_id: str | None
    admin: bool = False
    scopes: frozenset[str] = DEFAULT_SCOPES
    token_id: str = field(default="", compare=False)

    def can(self, scope: str) -> bool:
        """True when this caller holds `scope` (an admin holds every scope)."""
        return self.admin or scope in self.scopes

    def sees(self, organization_id: str | None) -> bool:
        """True when this caller may read or command a job of `organization_id`."""
        return self.admin or (
            self.organization_id is not None and organization_id == self.organization_id
        )


OPEN = Principal(organization_id=None, admin=True, scopes=frozenset(SCOPES), token_id="open")
"""The caller of an API running without tokens (loopback only)."""


@dataclass(frozen=True, slots=True)
class _Entry:
    digest: bytes
    principal: Principal


def token_digest(token: str) -> bytes:
    """The SHA-256 of `token`: all the token table keeps of it (and a console session)."""
    return hashlib.sha256(token.encode("utf-8")).digest()


class TokenTable:
    """The configured tokens; `authenticate` returns the token's principal or None."""

    def __init__(self, entries: Iterable[tuple[str, Principal]] = ()) -> None:
        self._entries: list[_Entry] = []
        seen: set[bytes] = set()
        for token, principal in entries:
            digest = token_digest(token)
            if digest in seen:
                raise TokenConfigError("a token is configured twice")
            seen.add(digest)
            principal = Principal(
                principal.organization_id,
                principal.admin,
                frozenset(SCOPES) if principal.admin else principal.scopes,
                token_id=digest.hex()[:12],
            )
            self._entries.append(_Entry(digest, principal))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"TokenTable({len(self._entries)} tokens)"

    @property
    def open(self) -> bool:
        """True when no token is configured (the API then runs open, loopback only)."""
        return not self._entries

    def authenticate(self, token: str) -> Principal | None:
        """Return the principal bound to `token`, or None.

        Every configured digest is compared with `hmac.compare_digest`, with no early exit, so the
        time taken says nothing about which token (or how much of one) matched.
        """
        return self.authenticate_digest(token_digest(token))

    def authenticate_digest(self, presented: bytes) -> Principal | None:
        """Return the principal of the token whose SHA-256 is `presented`, or None (in constant
        time, as `authenticate`): a console session names its token this way."""
        found: Principal | None = None
        for entry in self._entries:
            if hmac.compare_digest(entry.digest, presented):
                found = entry.principal
        return found


AUTHENTICATED = "bearer_authenticated"
"""The request state's key of the principal the in-flight gate (roles/api/in_flight.py)
authenticated the request's bearer token as: `deps.request_caller` takes it rather than
authenticating the same token again."""


def authenticated(state: object) -> Principal | None:
    """The principal the request's bearer token was authenticated as already (`state`: the
    request's), if it was."""
    principal = getattr(state, AUTHENTICATED, None)
    return principal if isinstance(principal, Principal) else None


def _check_token(token: str, where: str) -> str:
    if not token or any(c.isspace() or c == "," for c in token):
        raise TokenConfigError(f"{where}: a token must be non-empty, without spaces or commas")
    return token


def _scopes(names: list[str], where: str) -> frozenset[str]:
    unknown = [n for n in names if n not in SCOPES or n == ADMIN]
    if unknown:
        raise TokenConfigError(
            f"{where}: unknown scope {unknown[0]!r} for an organization token; scopes: "
            f"{', '.join(s for s in SCOPES if s != ADMIN)} (admin tokens are '*')"
        )
    return frozenset(names) if names else DEFAULT_SCOPES


def parse_lines(text: str, where: str) -> list[tuple[str, Principal]]:
    """Parse the line format: `<token> <organizationId> [scope ...]` or `<token> *` (admin).

    Entries are separated by newlines or commas; blank entries and lines starting with `#` are
    skipped.
    """
    entries: list[tuple[str, Principal]] = []
    for number, line in enumerate(text.replace(",", "\n").splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) < 2 or (parts[1] == ADMIN_MARKER and len(parts) > 2):
            raise TokenConfigError(
                f"{where}, entry {number}: expected '<token> <organizationId> [scope ...]' "
                "or '<token> *'"
            )
        token, owner, *scopes = parts
        _check_token(token, f"{where}, entry {number}")
        if owner == ADMIN_MARKER:
            entries.append((token, Principal(organization_id=None, admin=True)))
        else:
            granted = _scopes(scopes, f"{where}, entry {number}")
            entries.append((token, Principal(organization_id=owner, scopes=granted)))
    return entries


def parse_json(document: Any, where: str) -> list[tuple[str, Principal]]:
    """Parse the JSON format: a list (or `{"tokens": [...]}`) of token objects.

    Each object is `{"token": "...", "organizationId": "...", "scopes": [...]?}` or
    `{"token": "...", "admin": true}`.
    """
    if isinstance(document, dict) and set(document) == {"tokens"}:
        document = document["tokens"]
    if not isinstance(document, list):
        raise TokenConfigError(f'{where}: expected a JSON list of tokens or {{"tokens": [...]}}')
    entries: list[tuple[str, Principal]] = []
    for index, item in enumerate(document):
        at = f"{where}, token #{index + 1}"
        if not isinstance(item, dict) or not isinstance(item.get("token"), str):
            raise TokenConfigError(f"{at}: expected an object with a string 'token'")
        unknown = set(item) - {"token", "organizationId", "admin", "name", "scopes"}
        if unknown:
            raise TokenConfigError(f"{at}: unknown keys {sorted(unknown)}")
        token = _check_token(item["token"], at)
        admin = item.get("admin", False)
        organization_id = item.get("organizationId")
        if admin is True and organization_id is None:
            entries.append((token, Principal(organization_id=None, admin=True)))
        elif admin is False and isinstance(organization_id, str) and organization_id.strip():
            scopes = item.get("scopes", [])
            if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
                raise TokenConfigError(f"{at}: 'scopes' must be a list of strings")
            granted = _scopes(scopes, at)
            entries.append((token, Principal(organization_id=organization_id, scopes=granted)))
        else:
            raise TokenConfigError(
                f"{at}: give exactly one of a non-empty 'organizationId' or 'admin': true"
            )
    return entries


def parse_file(path: Path) -> list[tuple[str, Principal]]:
    """Read a tokens file: JSON when its first non-blank character is `[` or `{`, else lines."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TokenConfigError(f"cannot read RECEIPT_API_TOKENS_FILE {path}: {exc}") from exc
    if text.lstrip()[:1] in ("[", "{"):
        try:
            document = json.loads(text)
        except ValueError as exc:
            raise TokenConfigError(f"{path}: invalid JSON: {exc.args[0]}") from exc
        return parse_json(document, str(path))
    return parse_lines(text, str(path))


def load_tokens(tokens_file: Path | None, tokens: str | None) -> TokenTable:
    """Build the token table from `RECEIPT_API_TOKENS_FILE` and `RECEIPT_API_TOKENS` (both may be set)."""
    entries: list[tuple[str, Principal]] = []
    if tokens_file is not None:
        entries.extend(parse_file(tokens_file))
    if tokens:
        entries.extend(parse_lines(tokens, "RECEIPT_API_TOKENS"))
    return TokenTable(entries)


LOOPBACK_NAMES: Sequence[str] = ("localhost",)


def is_loopback(host: str) -> bool:
    """True when `host` is a loopback address (127.0.0.0/8, ::1) or `localhost`."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_open_bind(table: TokenTable, host: str) -> bool:
    """Refuse to run without tokens on a non-loopback bind; return True when the API runs open."""
    if not table.open:
        return False
    if not is_loopback(host):
        raise TokenConfigError(
            f"refusing to serve on {host} without API tokens: set RECEIPT_API_TOKENS_FILE or "
            "RECEIPT_API_TOKENS, or bind to a loopback address (RECEIPT_API_HOST=127.0.0.1)"
        )
    return True


LOCAL_TOKEN_FILE = "api-token"
LOCAL_TOKENS_FILE = "api-tokens"


def ensure_local_admin_token(data_dir: Path) -> tuple[str, Path]:
    """Return `receipt up`'s admin token and the tokens file that holds it, made on first start.

    `receipt up` never runs the API open (a web page in the operator's browser could reach an
    open loopback API): the first start writes a random token to `<data_dir>/api-token` and
    the tokens file `<data_dir>/api-tokens` (`<token> *`), both readable by the owner only;
    later starts reuse them.
    """
    import secrets

    token_path = data_dir / LOCAL_TOKEN_FILE
    tokens_path = data_dir / LOCAL_TOKENS_FILE
    if token_path.exists():
        token = token_path.read_text(encoding="utf-8").strip()
    else:
        token = secrets.token_urlsafe(32)
        token_path.touch(mode=0o600)
        token_path.write_text(token + "\n", encoding="utf-8")
    tokens_path.touch(mode=0o600)
    tokens_path.write_text(f"{token} {ADMIN_MARKER}\n", encoding="utf-8")
    return token, tokens_path
