"""The API's interactive docs (Swagger UI at /docs, ReDoc at /redoc) from local files.

FastAPI's own docs pages load Swagger UI and ReDoc from a CDN, so on a lab network without the
internet /docs is a blank page. The same pages are built here with FastAPI's
`get_swagger_ui_html` / `get_redoc_html`, pointed at the copies that the `fastapi-offline`
package ships (installed from PyPI with parallab; only its static files are used).

The routes are plain Starlette routes, as FastAPI's own docs routes are: they take none of the
app's dependencies. Whoever gates the docs (a login outside local mode, a setting that turns
them off) does it where `install_docs` is called: pass None for a page to leave it out, or wrap
the endpoints; `install_docs` returns the paths it served so the security middleware can give
them the docs' Content-Security-Policy.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.staticfiles import StaticFiles
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

ASSETS_PATH = "/vendor/docs"
ASSETS_DIR = Path(str(files("fastapi_offline") / "static"))
"""swagger-ui-bundle.js, swagger-ui.css and redoc.standalone.js."""


def install_docs(app: FastAPI, *, docs_url: str | None = "/docs", redoc_url: str | None = "/redoc") -> list[str]:
    """Serve the docs pages at `docs_url` and `redoc_url` (None: not served) from local assets;
    returns the paths served. The app must be created with docs_url=None and redoc_url=None."""
    if app.docs_url or app.redoc_url:
        raise RuntimeError("create the app with docs_url=None and redoc_url=None: install_docs serves them")
    openapi_url = app.openapi_url or "/openapi.json"
    title = f"{app.title} — API"
    served: list[str] = []
    if docs_url or redoc_url:
        app.mount(ASSETS_PATH, StaticFiles(directory=ASSETS_DIR), name="docs-assets")
    if docs_url:
        oauth2_url = f"{docs_url.rstrip('/')}/oauth2-redirect"

        async def swagger(_: Request) -> HTMLResponse:
            return get_swagger_ui_html(
                openapi_url=openapi_url,
                title=title,
                oauth2_redirect_url=oauth2_url,
                swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
                swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
                swagger_favicon_url="/static/favicon.svg",
            )

        async def oauth2_redirect(_: Request) -> HTMLResponse:
            return get_swagger_ui_oauth2_redirect_html()

        app.router.routes.append(Route(docs_url, swagger, methods=["GET"], include_in_schema=False))
        app.router.routes.append(Route(oauth2_url, oauth2_redirect, methods=["GET"], include_in_schema=False))
        served += [docs_url, oauth2_url]
    if redoc_url:

        async def redoc(_: Request) -> HTMLResponse:
            return get_redoc_html(
                openapi_url=openapi_url,
                title=title,
                redoc_js_url=f"{ASSETS_PATH}/redoc.standalone.js",
                redoc_favicon_url="/static/favicon.svg",
                with_google_fonts=False,
            )

        app.router.routes.append(Route(redoc_url, redoc, methods=["GET"], include_in_schema=False))
        served.append(redoc_url)
    return served
