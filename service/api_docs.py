"""The interactive API docs (/docs, Swagger UI; /redoc, ReDoc) served from packaged assets, so they
render offline: FastAPI's defaults load both from a CDN. The JavaScript and CSS come from the
`fastapi-offline` package's static folder, served under ASSETS_PATH."""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_PATH = "/api-docs-assets"


def install_api_docs(app: FastAPI) -> None:
    """Serve /docs and /redoc with local assets (create the app with docs_url=None, redoc_url=None)."""
    app.mount(ASSETS_PATH, StaticFiles(directory=str(files("fastapi_offline") / "static")), name="api-docs")
    title = f"{app.title} API"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url,
            title=title,
            swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_PATH}/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=app.openapi_url,
            title=title,
            redoc_js_url=f"{ASSETS_PATH}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS_PATH}/favicon.png",
            with_google_fonts=False,
        )
