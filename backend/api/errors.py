"""Domain errors → HTTP answers, in one place."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from sqlalchemy.exc import InterfaceError, OperationalError

from backend.api.deps import LoginRequired, is_api
from backend.services.auth import AccountError, Forbidden
from backend.services.runs import QueueUnavailable, RunNotFound, RunStateError
from backend.services.series import SeriesConfigError, SeriesNotFound
from backend.services.uploads import UploadInvalid
from parallab.core.problems import SpecError


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(SpecError)
    async def _spec_error(_: Request, exc: SpecError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": [p.as_detail() for p in exc.problems]})

    @app.exception_handler(RunNotFound)
    async def _not_found(_: Request, exc: RunNotFound) -> JSONResponse:
        return JSONResponse(status_code=404, content={"detail": f"no run {exc.args[0]!r}"})

    @app.exception_handler(RunStateError)
    async def _state(_: Request, exc: RunStateError) -> JSONResponse:
        return JSONResponse(status_code=409, content={"detail": str(exc)})

    @app.exception_handler(QueueUnavailable)
    async def _queue(_: Request, exc: QueueUnavailable) -> JSONResponse:
        return JSONResponse(status_code=503, content={"detail": str(exc)})

    # Accounts and CI series (issue #11).
    @app.exception_handler(LoginRequired)
    async def _login(_: Request, exc: LoginRequired) -> RedirectResponse:
        return RedirectResponse(f"/login?next={quote(exc.next_url, safe='')}", status_code=303)

    @app.exception_handler(Forbidden)
    async def _forbidden(request: Request, exc: Forbidden) -> Response:
        if is_api(request):
            return JSONResponse(status_code=403, content={"detail": str(exc)})
        from backend.api.pages.rendering import render_error

        return render_error(request, 403, "Not allowed", str(exc))

    @app.exception_handler(UploadInvalid)
    async def _upload(_: Request, exc: UploadInvalid) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": exc.detail})

    @app.exception_handler(SeriesNotFound)
    async def _no_series(_: Request, exc: SeriesNotFound) -> JSONResponse:
        return JSONResponse(status_code=404, content={"detail": f"no series {exc.args[0]!r}"})

    @app.exception_handler(SeriesConfigError)
    async def _series_config(_: Request, exc: SeriesConfigError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": [{"loc": ["body", exc.field], "msg": str(exc), "type": "value_error"}]})

    @app.exception_handler(AccountError)
    async def _account(_: Request, exc: AccountError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": [{"loc": ["body", exc.field], "msg": str(exc), "type": "value_error"}]})

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    async def _database_down(_: Request, exc: Exception) -> JSONResponse:
        # Issue 10: the database is unreachable (or went away mid-request). The engine's pool
        # pre-pings, so the next request after it is back reconnects: no restart needed.
        return JSONResponse(
            status_code=503, content={"detail": "the database is unavailable; try again shortly"}, headers={"Retry-After": "5"}
        )
