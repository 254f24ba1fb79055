"""Types that keep every accepted value storable: no NUL bytes, finite numbers, integers that fit.

A value the schemas accept must never fail later in the database. Postgres refuses a NUL byte
in `text` and in `jsonb` (and a lone surrogate, which Python's JSON parser lets through, is not
UTF-8 at all), integers beyond its column types, and JSON has no NaN or Infinity (and
pydantic would silently write them as null). So every string the API takes is NUL-free (`SafeStr`,
or a bounded alias of it), every integer a column holds is bounded to its column (`Count`,
`Bytes`, ...), and every free-form JSON object
(`JSONObject`: a result's `hardware`, `environment`, options, ...) is walked once: its keys and
strings storable, its numbers finite and within 64 bits, its nesting at most `MAX_JSON_DEPTH`.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, Field, StringConstraints

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
MAX_JSON_DEPTH = 32
"""Deepest nesting a free-form JSON object may have (lists and objects both count)."""


def text_problem(value: str) -> str | None:
    """Why Postgres could not store `value` (a NUL byte; a lone surrogate, which is not UTF-8), or None."""
    if "\x00" in value:
        return "must not contain a NUL byte"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "must be valid Unicode (no lone surrogate such as \\ud800)"
    return None


def storable(value: str) -> str:
    """`value`, if Postgres can store it as text (see `text_problem`)."""
    problem = text_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


SafeStr = Annotated[str, AfterValidator(storable)]
"""A NUL-free string; bound its length where it is used (`Field(max_length=...)`) or use one below."""
ShortName = Annotated[str, StringConstraints(min_length=1, max_length=32), AfterValidator(storable)]
"""A strategy or op name (a `String(32)` column)."""
Label = Annotated[str, StringConstraints(min_length=1, max_length=64), AfterValidator(storable)]
"""A tag or a model preset name."""
Name = Annotated[str, StringConstraints(max_length=200), AfterValidator(storable)]
"""A run's name, a branch (a `String(200)` column)."""

Int32 = Annotated[int, Field(ge=-(2**31), le=INT32_MAX)]
"""An integer an `Integer` column holds."""
Int64 = Annotated[int, Field(ge=-(2**63), le=INT64_MAX)]
"""An integer a `BigInteger` column (or a 64-bit JSON reader) holds."""
Count = Annotated[int, Field(ge=0, le=INT32_MAX)]
"""A non-negative count stored in an `Integer` column."""
Bytes = Annotated[int, Field(ge=0, le=INT64_MAX)]
"""A non-negative byte count stored in a `BigInteger` column."""


def json_problem(value: Any, depth: int = 0) -> tuple[tuple[str | int, ...], str] | None:
    """(path, why) of the first value in a parsed JSON value that could not be stored, or None."""
    if isinstance(value, str):
        problem = text_problem(value)
        return None if problem is None else ((), problem)
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else ((), "must be a finite number (no NaN or Infinity)")
    if isinstance(value, int):
        return None if -(2**63) <= value <= INT64_MAX else ((), "integer does not fit in 64 bits")
    if depth >= MAX_JSON_DEPTH and isinstance(value, (dict, list)):
        return ((), f"nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, dict):
        for key, item in value.items():
            problem = text_problem(str(key))
            if problem is not None:
                return ((_printable(str(key)),), f"key {problem}")
            found = json_problem(item, depth + 1)
            if found is not None:
                return ((_printable(str(key)), *found[0]), found[1])
        return None
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = json_problem(item, depth + 1)
            if found is not None:
                return ((index, *found[0]), found[1])
        return None
    return ((), f"is not a JSON value ({type(value).__name__})")


def _printable(key: str) -> str:
    """A key as an error message may quote it (cut, and UTF-8 whatever it held)."""
    return key[:100].encode("utf-8", "replace").decode("utf-8")


def check_json(value: Any) -> Any:
    """`value`, unless something in it could not be stored (the message names the path inside)."""
    found = json_problem(value)
    if found is not None:
        path, why = found
        where = ".".join(map(str, path))
        raise ValueError(f"{where}: {why}" if where else why)
    return value


JSONObject = Annotated[dict[str, Any], AfterValidator(check_json)]
"""A free-form JSON object that can be stored as is (see `json_problem`)."""
