"""The base of every route's query-string model: what each list route refuses, and how.

A route reads its whole query string as one model (`Annotated[Model, Query()]`), so the OpenAPI
document lists each name with its bounds, and every route refuses the same way: a misspelt name is
a 422 naming it and listing the names the route takes (never ignored: `?stratgy=ddp` answers a
question nobody asked), an HTML form's empty value ("any") is unset, and a repeated parameter
(`?accumulation=1&accumulation=1`) is one value: a list is de-duplicated in order, after its
length is held to the field's `max_length` — every list parameter declares one (a test walks the
routes), so no query string makes a route plan, fetch or render without bound.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, field_validator, model_validator


class QueryParams(BaseModel):
    """A route's whole query string: a name not declared here is refused listing those that are,
    an empty value (an HTML form's "any") is unset, and a list keeps each value once. Subclasses
    declare the parameters; `route` names the list in the refusal."""

    model_config = ConfigDict(protected_namespaces=(), extra="forbid")
    route: ClassVar[str] = "this route"

    @model_validator(mode="before")
    @classmethod
    def _known_names_empty_is_unset(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(k for k in data if k not in cls.model_fields)
            if unknown:
                takes = ", ".join(cls.model_fields) or "no parameters"
                raise ValueError(f"unknown parameter {', '.join(map(repr, unknown))}; {cls.route} takes: {takes}")
            return {k: v.strip() if isinstance(v, str) else v for k, v in data.items() if not (isinstance(v, str) and not v.strip())}
        return data

    @field_validator("*", mode="after")
    @classmethod
    def _each_value_once(cls, value: Any) -> Any:
        """A repeated value of a list parameter counts once (its bound was held on the list as sent)."""
        return list(dict.fromkeys(value)) if isinstance(value, list) else value
