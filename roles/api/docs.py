"""The API reference at `/docs`, served offline: Swagger UI's assets (a 5.x build, which reads
OpenAPI 3.1) come from the installed `fastapi-offline` package, never a CDN — FastAPI's default
page is blank without internet."""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_PATH = "/docs/assets"
SWAGGER_UI_DIR = Path(fastapi_offline.__file__).parent / "static"


def install_docs(app: FastAPI) -> None:
    """Serve `/docs` (Swagger UI over `/openapi.json`) with every asset from the api itself.

    Build the app with `docs_url=None, redoc_url=None`, so FastAPI's CDN pages are not served.
    """
    app.mount(ASSETS_PATH, StaticFiles(directory=SWAGGER_UI_DIR), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} — reference",
            swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_PATH}/favicon.png",
        )
