"""One bounded JSON parse for request bodies: nesting is limited, so no body reaches a recursion limit.

Python's `json.loads` follows nesting on the C stack: a body nested 1,000 deep raises
`RecursionError` (not a `ValueError`, so a caller that catches parse errors answers 500), and one
nested 900 deep parses, only to break whatever walks it next (hashing, validation, an echo of the
input). pydantic-core's parser stops at `MAX_JSON_DEPTH` levels with a plain parse error, at C
speed, so it is the parse every body goes through (`parse_json`); the size of a body is bounded
before it is read whole (`api.body`).

An integer longer than Python converts from a string (`sys.get_int_max_str_digits()`, 4,300 digits)
is refused by both parsers with an error that names no field — FastAPI answered it as an
unlocated 400. The standard parser's `parse_int` hook marks such a number instead of converting it,
and `JSONNumberTooLong` names where it sits (`loc`), so the body is answered 422 naming its field
as any other value out of bounds is.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
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


class JSONNumberTooLong(json.JSONDecodeError):
    """A body holding an integer longer than Python converts; `loc` is where (keys and indexes)."""

    def __init__(self, loc: tuple[str | int, ...], digits: int) -> None:
        self.loc, self.digits = loc, digits
        limit = sys.get_int_max_str_digits()
        super().__init__(f"an integer of {digits:,} digits; a number here has at most {limit:,} (and its field's own bounds)", "", 0)

    def __str__(self) -> str:
        return self.msg


class _LongInt:
    """What `parse_int` leaves where an integer too long to convert was."""

    def __init__(self, digits: int) -> None:
        self.digits = digits


def _bounded_int(text: str) -> int | _LongInt:
    digits = len(text.lstrip("-"))
    limit = sys.get_int_max_str_digits()
    return _LongInt(digits) if limit and digits > limit else int(text)


def _long_ints(value: Any, loc: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple[str | int, ...], _LongInt]]:
    """Where each marked integer sits in a parsed value (walked iteratively: the depth is bounded already)."""
    stack = [(loc, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, _LongInt):
            yield where, item
        elif isinstance(item, dict):
            stack += [((*where, key), v) for key, v in reversed(item.items())]
        elif isinstance(item, list):
            stack += [((*where, i), v) for i, v in reversed(list(enumerate(item)))]


def parse_json(body: bytes | str) -> Any:
    """The JSON value of `body`; `json.JSONDecodeError` (a ValueError) for one that is not JSON or
    is nested deeper than MAX_JSON_DEPTH.

    What pydantic-core refuses for another reason goes to the standard parser, which gives its
    usual message, or accepts what JSON allows and pydantic-core does not (an escaped lone
    surrogate, UTF-16 text): such a body has already been read that deep without passing the
    limit, and the standard parser's own RecursionError is caught all the same. An integer too long
    to convert raises `JSONNumberTooLong` naming the first such one's place."""
    try:
        return pydantic_core.from_json(body)
    except ValueError as exc:
        if too_deep(str(exc)):
            raise JSONTooDeep() from None
    try:
        value = json.loads(body, parse_int=_bounded_int)
    except RecursionError:
        raise JSONTooDeep() from None
    for loc, number in _long_ints(value):
        raise JSONNumberTooLong(loc, number.digits)
    return value
