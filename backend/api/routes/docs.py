"""The API's own documentation: /openapi.json, /docs (Swagger UI), /redoc — from local files.

Served by routes of ours rather than FastAPI's built-in ones, for two reasons:
- they pass the app's `gate` like every other route: in local mode they are open; in a lab they
  need a login unless the deployment sets `docs_public` (the schema names every route and field
  an attacker could try);
- FastAPI's own pages load Swagger UI and ReDoc from a CDN, so on a lab network without the
  internet /docs would be a blank page. These pages load the copies that the `fastapi-offline`
  package ships (installed from PyPI with parallab; only its static files are used), mounted at
  `ASSETS_PATH` by `mount_assets`.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

OPENAPI_URL = "/openapi.json"
DOCS_URL = "/docs"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
REDOC_URL = "/redoc"
"""The four paths `deps.DOCS_PATHS` names (the gate opens them when `docs_public`)."""
ASSETS_PATH = "/vendor/docs"
ASSETS_DIR = Path(str(files("fastapi_offline") / "static"))
"""swagger-ui-bundle.js, swagger-ui.css and redoc.standalone.js (public files, like /static)."""

router = APIRouter(include_in_schema=False)


def mount_assets(app: FastAPI) -> None:
    """Serve the docs pages' scripts and styles from this host."""
    app.mount(ASSETS_PATH, StaticFiles(directory=ASSETS_DIR), name="docs-assets")


def _root(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


def _title(request: Request) -> str:
    return f"{request.app.title} — API"


@router.get(OPENAPI_URL)
def openapi(request: Request) -> JSONResponse:
    schema: dict[str, Any] = request.app.openapi()
    return JSONResponse(schema)


@router.get(DOCS_URL)
def swagger_ui(request: Request) -> HTMLResponse:
    root = _root(request)
    return get_swagger_ui_html(
        openapi_url=root + OPENAPI_URL,
        title=_title(request),
        oauth2_redirect_url=root + OAUTH2_REDIRECT_URL,
        swagger_js_url=f"{root}{ASSETS_PATH}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{ASSETS_PATH}/swagger-ui.css",
        swagger_favicon_url=f"{root}/static/favicon.svg",
    )


@router.get(OAUTH2_REDIRECT_URL)
def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get(REDOC_URL)
def redoc(request: Request) -> HTMLResponse:
    root = _root(request)
    return get_redoc_html(
        openapi_url=root + OPENAPI_URL,
        title=_title(request),
        redoc_js_url=f"{root}{ASSETS_PATH}/redoc.standalone.js",
        redoc_favicon_url=f"{root}/static/favicon.svg",
        with_google_fonts=False,
    )
