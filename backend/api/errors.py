"""Domain errors → HTTP answers, in one place."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError

from backend.services.runs import QueueUnavailable, RunNotFound, RunStateError
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

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    async def _database_down(_: Request, exc: Exception) -> JSONResponse:
        # Issue 10: the database is unreachable (or went away mid-request). The engine's pool
        # pre-pings, so the next request after it is back reconnects: no restart needed.
        return JSONResponse(
            status_code=503, content={"detail": "the database is unavailable; try again shortly"}, headers={"Retry-After": "5"}
        )
