"""The base of every strategy's (and job kind's) options model — outside the strategies package, so
modules the strategies share (`parallab.core.interconnect`) can build on it without importing the
registry. `parallab.core.strategies.base` re-exports both names."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


def known_keys_only(model: type[BaseModel], data: Any, *, what: str = "field") -> Any:
    """`data` unchanged, or a ValueError naming each unknown key and every valid one: pydantic's
    own refusal ("Extra inputs are not permitted") names neither."""
    if isinstance(data, dict):
        fields = model.model_fields
        valid = set(fields) | {f.alias for f in fields.values() if f.alias}
        unknown = sorted(str(k) for k in data if k not in valid)
        if unknown:
            names = ", ".join(sorted(fields)) or "none"
            raise ValueError(f"unknown {what}{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; valid: {names}")
    return data


class StrategyOptions(BaseModel):
    """Base of every options model: unknown keys are refused, so a typo never silently does nothing."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _known_options(cls, data: Any) -> Any:
        return known_keys_only(cls, data, what="option")


class NoOptions(StrategyOptions):
    """A strategy without options."""
