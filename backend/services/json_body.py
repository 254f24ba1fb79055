"""One bounded JSON parse for request bodies: nesting is limited, so no body reaches a recursion limit.

Python's `json.loads` follows nesting on the C stack: a body nested 1,000 deep raises
`RecursionError` (not a `ValueError`, so a caller that catches parse errors answers 500), and one
nested 900 deep parses, only to break whatever walks it next (hashing, validation, an echo of the
input). pydantic-core's parser stops at `MAX_JSON_DEPTH` levels with a plain parse error, at C
speed, so it is the parse every body goes through (`parse_json`); the size of a body is bounded
before it is read whole (`api.body`).
"""

from __future__ import annotations

import json
from typing import Any

import pydantic_core

MAX_JSON_DEPTH = 200
"""Deepest nesting of arrays and objects a body may have (pydantic-core's parser refuses deeper)."""

_TOO_DEEP = "recursion limit exceeded"


def too_deep(message: str) -> bool:
    """Whether a parse error (pydantic-core's message) says the body is nested too deep."""
    return _TOO_DEEP in message


class JSONTooDeep(json.JSONDecodeError):
    """A body nested deeper than MAX_JSON_DEPTH (its message names no position: there is none to name)."""

    def __init__(self) -> None:
        super().__init__(f"JSON nested deeper than {MAX_JSON_DEPTH} levels", "", 0)

    def __str__(self) -> str:
        return self.msg


def parse_json(body: bytes | str) -> Any:
    """The JSON value of `body`; `json.JSONDecodeError` (a ValueError) for one that is not JSON or
    is nested deeper than MAX_JSON_DEPTH.

    What pydantic-core refuses for another reason goes to the standard parser, which gives its
    usual message, or accepts what JSON allows and pydantic-core does not (an escaped lone
    surrogate, UTF-16 text): such a body has already been read that deep without passing the
    limit, and the standard parser's own RecursionError is caught all the same."""
    try:
        return pydantic_core.from_json(body)
    except ValueError as exc:
        if too_deep(str(exc)):
            raise JSONTooDeep() from None
    try:
        return json.loads(body)
    except RecursionError:
        raise JSONTooDeep() from None
