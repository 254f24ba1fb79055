"""The pages' template environment and the helpers every page group renders with.

Templates live in frontend/templates: autoescaped, `StrictUndefined`, with the number filters of
`backend.api.formatting`. Every page gets a CSRF token (and its cookie) for the forms it may carry.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from fastapi import Request, Response
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

import frontend
from backend.api import csrf, formatting
from backend.api.deps import local_mode
from backend.config import Settings, get_settings
from backend.figures.common import Figure
from backend.services.auth import ANONYMOUS
from backend.services.glossary import METRIC_TERMS
from parallab.core.flags import FLAG_TOLERANCE

FRONTEND = Path(frontend.__file__).parent


def figure_json(fig: Figure) -> Markup:
    """A figure as JSON that is safe inside <script type="application/json"> (no '<', '>', '&')."""
    text = fig.to_json().replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return Markup(text)


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(FRONTEND / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(formatting.FILTERS)
    env.globals["figure_json"] = figure_json
    env.globals["flag_tolerance"] = FLAG_TOLERANCE
    env.globals["metric_terms"] = METRIC_TERMS
    return env


templates = Jinja2Templates(env=_environment())


def secure_cookies(request: Request, settings: Settings) -> bool:
    """Every cookie parallab sets (session and CSRF) is Secure off loopback, and always over https."""
    return request.url.scheme == "https" or not settings.loopback


def render(request: Request, name: str, context: dict[str, Any], *, settings: Settings, status_code: int = 200) -> HTMLResponse:
    """Render a page with a CSRF token for its forms, setting this browser's CSRF cookie if it has none."""
    nonce, token = csrf.issue(request, settings.security.secret_key) if settings.security.secret_key else ("", "")
    principal = getattr(request.state, "principal", ANONYMOUS)
    response = templates.TemplateResponse(
        request,
        name,
        {"csrf_token": token, "page": name.removesuffix(".html"), "principal": principal, "local_mode": local_mode(request), **context},
        status_code=status_code,
    )
    if nonce and request.cookies.get(csrf.COOKIE) != nonce:
        csrf.set_cookie(response, nonce, secure=secure_cookies(request, settings))
    return response


def render_error(request: Request, status_code: int, title: str, message: str, *, settings: Settings | None = None) -> HTMLResponse:
    """The error page. From an exception handler (which gets no dependencies) the settings are looked up."""
    if settings is None:
        settings = request.app.dependency_overrides.get(get_settings, get_settings)()
    return render(request, "error.html", {"title": title, "message": message}, settings=settings, status_code=status_code)


def csv_response(rows: list[list[Any]], filename: str) -> Response:
    """Rows as a CSV download (None as an empty cell)."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    for row in rows:
        writer.writerow(["" if v is None else v for v in row])
    return Response(
        buf.getvalue(), media_type="text/csv; charset=utf-8", headers={"Content-Disposition": f'attachment; filename="{filename}"'}
    )
