"""The API's own documentation: /openapi.json, /docs (Swagger UI), /redoc.

Served by routes of ours rather than FastAPI's built-in ones, so that they pass the app's `gate`
like every other route: in local mode they are open; in a lab they need a login unless the
deployment sets `docs_public` (the schema names every route and field an attacker could try).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, JSONResponse

OPENAPI_URL = "/openapi.json"
DOCS_URL = "/docs"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
REDOC_URL = "/redoc"
"""The four paths `deps.DOCS_PATHS` names (the gate opens them when `docs_public`)."""

router = APIRouter(include_in_schema=False)


def _root(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


@router.get(OPENAPI_URL)
def openapi(request: Request) -> JSONResponse:
    schema: dict[str, Any] = request.app.openapi()
    return JSONResponse(schema)


@router.get(DOCS_URL)
def swagger_ui(request: Request) -> HTMLResponse:
    root = _root(request)
    return get_swagger_ui_html(
        openapi_url=root + OPENAPI_URL, title=f"{request.app.title} - Swagger UI", oauth2_redirect_url=root + OAUTH2_REDIRECT_URL
    )


@router.get(OAUTH2_REDIRECT_URL)
def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get(REDOC_URL)
def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(openapi_url=_root(request) + OPENAPI_URL, title=f"{request.app.title} - ReDoc")
