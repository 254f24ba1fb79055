"""Domain errors → HTTP answers, in one place.

Every domain error answered as "a status and a detail" subclasses
`backend.services.errors.DomainError`, which carries its status, its detail's shape, its headers
(Retry-After) and, for errors a page route may meet, the title of the HTML error page: one
handler answers them all. The handlers that stay separate are those for errors that are not ours
to subclass or that answer with something other than a status and a detail:

- `RequestValidationError` (FastAPI's) and `SpecError` (the domain core's, which may not reach
  the backend): 422s whose items are made JSON-safe and capped, as below;
- `LoginRequired`: a redirect to the login page, not an error status;
- SQLAlchemy's `OperationalError`/`InterfaceError` (the database is down) and its pool
  `TimeoutError` (the server is saturated): 503s with their own Retry-After.

CSRF failures and the rate limit's 429 are answered where they are detected (`backend.api.csrf`,
`backend.api.ratelimit`, and the form routes, which re-render the form), not here.

Request validation errors get their own handler: FastAPI's default one echoes each bad input
whole (a 1 MB body comes back as a 1 MB error) and fails with a 500 on the NaN or Infinity that
Python's JSON parser lets through. Here each echoed input is made JSON-safe and capped, and so
is the number of errors listed.
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from backend.api.deps import LoginRequired, is_api
from backend.services.errors import DomainError, validation_detail
from parallab.core.problems import SpecError


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": validation_detail(list(exc.errors()))})

    @app.exception_handler(SpecError)
    async def _spec_error(_: Request, exc: SpecError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": validation_detail([p.as_detail() for p in exc.problems])})

    @app.exception_handler(DomainError)
    async def _domain_error(request: Request, exc: DomainError) -> Response:
        if exc.page_title is not None and not is_api(request):
            from backend.api.pages.rendering import render_error

            return render_error(request, exc.status_code, exc.page_title, str(exc))
        return JSONResponse(status_code=exc.status_code, content={"detail": exc.http_detail()}, headers=exc.http_headers())

    @app.exception_handler(LoginRequired)
    async def _login(_: Request, exc: LoginRequired) -> RedirectResponse:
        return RedirectResponse(f"/login?next={quote(exc.next_url, safe='')}", status_code=303)

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    async def _database_down(_: Request, exc: Exception) -> JSONResponse:
        # The database is unreachable (or went away mid-request). The engine's pool
        # pre-pings, so the next request after it is back reconnects: no restart needed.
        return JSONResponse(
            status_code=503, content={"detail": "the database is unavailable; try again shortly"}, headers={"Retry-After": "5"}
        )

    @app.exception_handler(PoolTimeout)
    async def _no_connection(_: Request, exc: Exception) -> JSONResponse:
        # Every pooled connection stayed busy for the pool's timeout (settings.database.db_pool_timeout_s):
        # the server is saturated, not broken; the client may retry.
        return JSONResponse(
            status_code=503,
            content={"detail": "the server is busy (no database connection was free); try again shortly"},
            headers={"Retry-After": "2"},
        )
