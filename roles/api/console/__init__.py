"""The operator console at `/console`: server-rendered pages over the same store and operations
as the JSON API, signed in by pasting a token once.

Sign-in exchanges the token for a session stored in PostgreSQL (`session.py`) and sets an
HttpOnly, SameSite=Strict cookie holding the session's random id, never the token (scoped to
`/console`); the token's organization and admin flag apply to every page exactly as on the API.
Every form carries the session's CSRF token (random per session, stored with it: a page of
another origin can read neither the cookie nor our pages). Every asset is served from this
package: no CDN.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from roles.api.console import pages
from roles.api.console.agent_job_pages import router as agent_job_router
from roles.api.console.objective_pages import router as objective_router
from roles.api.console.schedule_pages import router as schedule_router
from roles.api.console.session import FormError, PageMissing, SignInRequired

log = logging.getLogger("roles.api.console")


def install_console(app: FastAPI) -> None:
    """Serve the console's pages and assets, and turn its refusals into pages, not JSON."""
    app.include_router(pages.router)
    app.include_router(agent_job_router)
    app.include_router(objective_router)
    app.include_router(schedule_router)
    app.mount("/console/static", StaticFiles(directory=pages.STATIC_DIR), name="console-static")

    @app.exception_handler(SignInRequired)
    async def sign_in(request: Request, exc: SignInRequired) -> Response:
        # A page's own stream or poll is told 401 (its script stops), not sent to the form.
        if request.method == "GET" and not request.url.path.endswith(("/events", "/state")):
            return RedirectResponse("/console/login", status_code=303)
        return Response("sign in at /console/login", status_code=401)

    @app.exception_handler(FormError)
    async def form_error(request: Request, exc: FormError) -> Response:
        log.info(
            "console form refused",
            extra={"event": "console.form_refused", "status": exc.status, "path": request.url.path},
        )
        return pages.render("error.html", status=exc.status, session=None, message=exc.message)

    @app.exception_handler(PageMissing)
    async def page_missing(request: Request, exc: PageMissing) -> Response:
        log.info(
            "console page missing",
            extra={"event": "console.page_missing", "path": request.url.path},
        )
        return pages.render("missing.html", status=404, session=exc.session, what=exc.what)
