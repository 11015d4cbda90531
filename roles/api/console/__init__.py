"""The operator console at `/console`: server-rendered pages over the same store and operations
as the JSON API, signed in by pasting a token once.

Sign-in sets an HttpOnly, SameSite=Strict cookie holding the token (scoped to `/console`); the
token's organization and admin flag apply to every page exactly as on the API. Every form carries
a CSRF token derived from the session (an HMAC a page of another origin cannot compute, since it
can read neither the cookie nor our pages). Every asset is served from this package: no CDN.
"""

from __future__ import annotations

from roles.api.console.pages import router

__all__ = ["router"]
