"""Domain errors → HTTP answers, in one place.

Request validation errors get their own handler: FastAPI's default one echoes each bad input
whole (a 1 MB body comes back as a 1 MB error) and fails with a 500 on the NaN or Infinity that
Python's JSON parser lets through. Here each echoed input is made JSON-safe and capped, and so
is the number of errors listed.
"""

from __future__ import annotations

import json
import math
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from backend.api.deps import LoginRequired, is_api
from backend.api.upload_pool import UploadsBusy
from backend.services.auth import AccountError, Forbidden
from backend.services.ingest import IdempotencyConflict
from backend.services.quotas import QuotaExceeded
from backend.services.reproduce import NotAnUpload
from backend.services.runs import QueueUnavailable, RunNotFound, RunStateError
from backend.services.series import SeriesConfigError, SeriesNotFound
from backend.services.uploads import UploadInvalid, UploadRaced
from parallab.core.problems import SpecError

MAX_ECHO_CHARS = 200
"""Longest echo of a bad input in a 422 (longer ones are cut, with a note)."""
MAX_ERRORS = 20
"""Most validation errors listed; the rest are counted."""


def utf8(text: str) -> str:
    """`text` as UTF-8 can carry it (a lone surrogate from the client's JSON becomes '?')."""
    return text if text.isascii() else text.encode("utf-8", "replace").decode("utf-8")


def json_safe(value: Any, depth: int = 0) -> Any:
    """`value` with what JSON can't hold turned into strings (NaN, Infinity, lone surrogates, bytes, objects)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        return utf8(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if depth > 8:
        return "…"
    if isinstance(value, dict):
        return {utf8(str(k)): json_safe(v, depth + 1) for k, v in list(value.items())[:50]}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, depth + 1) for v in list(value)[:50]]
    if isinstance(value, bytes):
        return value[:MAX_ECHO_CHARS].decode("utf-8", "replace")
    return utf8(str(value))


def capped(value: Any) -> Any:
    """A JSON-safe echo of `value`, or its first MAX_ECHO_CHARS characters when it is longer."""
    safe = json_safe(value)
    text = json.dumps(safe, ensure_ascii=False)
    if len(text) <= MAX_ECHO_CHARS:
        return safe
    return f"{text[:MAX_ECHO_CHARS]}… ({len(text)} characters, cut)"


def _loc_part(part: Any) -> Any:
    """One step of an error's location (a key may be anything the client sent: cap it)."""
    if isinstance(part, int):
        return part
    text = utf8(str(part))
    return text if len(text) <= MAX_ECHO_CHARS else f"{text[:MAX_ECHO_CHARS]}…"


def validation_detail(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """FastAPI's 422 items, each input capped, at most MAX_ERRORS of them (then a count)."""
    detail = []
    for err in errors[:MAX_ERRORS]:
        item = {"type": err.get("type"), "loc": [_loc_part(p) for p in err.get("loc", ())], "msg": utf8(str(err.get("msg", "")))[:1000]}
        if "input" in err:
            item["input"] = capped(err["input"])
        if err.get("ctx"):
            item["ctx"] = {utf8(str(k)): capped(v) for k, v in err["ctx"].items()}
        detail.append(item)
    if len(errors) > MAX_ERRORS:
        detail.append({"type": "too_many_errors", "loc": [], "msg": f"and {len(errors) - MAX_ERRORS} more errors"})
    return detail


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": validation_detail(list(exc.errors()))})

    @app.exception_handler(SpecError)
    async def _spec_error(_: Request, exc: SpecError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": validation_detail([p.as_detail() for p in exc.problems])})

    @app.exception_handler(RunNotFound)
    async def _not_found(_: Request, exc: RunNotFound) -> JSONResponse:
        return JSONResponse(status_code=404, content={"detail": f"no run {capped(exc.args[0])!r}"})

    @app.exception_handler(RunStateError)
    async def _state(_: Request, exc: RunStateError) -> JSONResponse:
        return JSONResponse(status_code=409, content={"detail": str(exc)})

    @app.exception_handler(NotAnUpload)
    async def _not_an_upload(_: Request, exc: NotAnUpload) -> JSONResponse:
        return JSONResponse(status_code=409, content={"detail": str(exc)})

    @app.exception_handler(IdempotencyConflict)
    async def _idempotency(_: Request, exc: IdempotencyConflict) -> JSONResponse:
        return JSONResponse(status_code=409, content={"detail": str(exc)})

    @app.exception_handler(QueueUnavailable)
    async def _queue(_: Request, exc: QueueUnavailable) -> JSONResponse:
        return JSONResponse(status_code=503, content={"detail": str(exc)})

    # Accounts and CI series.
    @app.exception_handler(LoginRequired)
    async def _login(_: Request, exc: LoginRequired) -> RedirectResponse:
        return RedirectResponse(f"/login?next={quote(exc.next_url, safe='')}", status_code=303)

    @app.exception_handler(Forbidden)
    async def _forbidden(request: Request, exc: Forbidden) -> Response:
        if is_api(request):
            return JSONResponse(status_code=403, content={"detail": str(exc)})
        from backend.api.pages.rendering import render_error

        return render_error(request, 403, "Not allowed", str(exc))

    @app.exception_handler(QuotaExceeded)
    async def _quota(request: Request, exc: QuotaExceeded) -> Response:
        if is_api(request):
            return JSONResponse(status_code=429, content={"detail": str(exc)})
        from backend.api.pages.rendering import render_error

        return render_error(request, 429, "Over the quota", str(exc))

    @app.exception_handler(UploadInvalid)
    async def _upload(_: Request, exc: UploadInvalid) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": validation_detail(exc.detail)})

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
        # The database is unreachable (or went away mid-request). The engine's pool
        # pre-pings, so the next request after it is back reconnects: no restart needed.
        return JSONResponse(
            status_code=503, content={"detail": "the database is unavailable; try again shortly"}, headers={"Retry-After": "5"}
        )

    @app.exception_handler(PoolTimeout)
    async def _no_connection(_: Request, exc: Exception) -> JSONResponse:
        # Every pooled connection stayed busy for the pool's timeout (settings.db_pool_timeout_s):
        # the server is saturated, not broken; the client may retry.
        return JSONResponse(
            status_code=503,
            content={"detail": "the server is busy (no database connection was free); try again shortly"},
            headers={"Retry-After": "2"},
        )

    @app.exception_handler(UploadsBusy)
    async def _uploads_busy(_: Request, exc: UploadsBusy) -> JSONResponse:
        return JSONResponse(status_code=503, content={"detail": str(exc)}, headers={"Retry-After": str(exc.retry_after_s)})

    @app.exception_handler(UploadRaced)
    async def _upload_raced(_: Request, exc: UploadRaced) -> JSONResponse:
        return JSONResponse(status_code=503, content={"detail": str(exc)}, headers={"Retry-After": "1"})
