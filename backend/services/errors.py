"""The base of the errors the app answers with a status of their own, and the shape of their detail.

A domain error that the API answers as "this status, this detail" subclasses `DomainError`,
naming its `status_code` (and, where it needs them, its `http_detail`, `http_headers` and
`page_title`); `backend.api.errors` registers one handler for the base. Each subclass keeps its
builtin base too (`LookupError`, `ValueError`, …), so the `except` clauses that catch it by
that base still do.

The JSON-safety helpers live here, not in the API, because an error's detail is built by the
error itself: a run id echoed in a 404 is capped, an upload's 422 items are FastAPI's shape,
capped. They use the standard library only.
"""

from __future__ import annotations

import json
import math
from typing import Any, ClassVar

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


class DomainError(Exception):
    """An error answered as `{"detail": http_detail()}` with `status_code` and `http_headers()`.

    A subclass with a `page_title` is answered on a page route (any path but the API's) with the
    HTML error page under that title and its message instead of JSON.
    """

    status_code: ClassVar[int] = 400
    page_title: ClassVar[str | None] = None

    def http_detail(self) -> Any:
        """The response's `detail`: the message, unless a subclass has a shape of its own."""
        return str(self)

    def http_headers(self) -> dict[str, str] | None:
        """Headers the answer carries (None: none)."""
        return None


class FieldError(DomainError, ValueError):
    """A 422 naming one body field, in FastAPI's item shape; the message starts with the field."""

    status_code = 422

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")

    def http_detail(self) -> Any:
        return [{"loc": ["body", self.field], "msg": str(self), "type": "value_error"}]
