"""Bounded request bodies: every body is limited in size before it is read whole, and every JSON
body in nesting before any route parses it.

One pure ASGI middleware. A body larger than `max_request_bytes` is answered 413 (at once when its
Content-Length says so, else as soon as it passes the limit); a JSON body (or one without a
content type, which FastAPI reads as JSON) nested deeper than `json_body.MAX_JSON_DEPTH` is
answered 422, the same `json_invalid` shape FastAPI gives a body that is not JSON. Only then does
the route see the body, so no parser behind it meets a body that could exhaust its recursion.

CI uploads (`POST /api/v1/results`) are bounded by their own route instead, which reads up to
`max_upload_bytes` and parses in the upload pool with the same bounded parse (not on the event
loop, where a wide document's parse would stall every other request).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import HTTPException, Request, status

from backend.api.security import settings_for
from backend.services.json_body import JSONNumberTooLong, JSONTooDeep, parse_json

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SELF_BOUNDED = frozenset({("POST", "/api/v1/results")})
"""Routes that read and parse their own body within their own limit."""


async def read_limited_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it passes `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, detail=f"result documents are limited to {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, detail=f"result documents are limited to {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _json_body(headers: dict[str, str]) -> bool:
    """Whether FastAPI would read this body as JSON (a JSON content type, or none)."""
    kind = headers.get("content-type", "").split(";")[0].strip().lower()
    return not kind or kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


async def _answer(send: Send, code: int, detail: Any) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BoundedBodies:
    """Size and nesting bounds on every request body (see the module's docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope.get("method"), scope.get("path")) in SELF_BOUNDED:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        declared = headers.get("content-length", "")
        if not declared and "chunked" not in headers.get("transfer-encoding", ""):
            await self.app(scope, receive, send)  # no body
            return
        limit = settings_for(scope).server.max_request_bytes
        too_large = f"request bodies are limited to {limit} bytes"
        if declared.isdigit() and int(declared) > limit:
            await _answer(send, 413, too_large)
            return
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await _answer(send, 413, too_large)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if body and _json_body(headers):
            try:
                parse_json(body)
            except JSONTooDeep as exc:
                await _answer(send, 422, [{"type": "json_invalid", "loc": ["body"], "msg": str(exc)}])
                return
            except JSONNumberTooLong as exc:
                await _answer(send, 422, [{"type": "int_too_long", "loc": ["body", *exc.loc], "msg": str(exc)}])
                return
            except ValueError:
                pass  # not JSON: the route answers that as it always has
        await self.app(scope, _replay(body, receive), send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands the app the body already read, then waits on the real one (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
