"""The base of every strategy's (and job kind's) options model — outside the strategies package, so
modules the strategies share (`parallab.core.interconnect`) can build on it without importing the
registry. `parallab.core.strategies.base` re-exports both names."""

from __future__ import annotations

from difflib import get_close_matches
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer, model_validator


def known_keys_only(model: type[BaseModel], data: Any, *, what: str = "field") -> Any:
    """`data` unchanged, or a ValueError naming each unknown key and every valid one (and, for a
    near miss, the valid name it most resembles): pydantic's own refusal ("Extra inputs are not
    permitted") names neither."""
    if isinstance(data, dict):
        fields = model.model_fields
        valid = set(fields) | {f.alias for f in fields.values() if f.alias}
        unknown = sorted(str(k) for k in data if k not in valid)
        if unknown:
            names = ", ".join(sorted(fields)) or "none"
            message = f"unknown {what}{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; valid: {names}"
            if len(fields) > 1:
                near = [(key, close[0]) for key in unknown if (close := get_close_matches(key, sorted(valid), n=1))]
                if near:
                    hints = [f"{close!r} for {key!r}" if len(unknown) > 1 else repr(close) for key, close in near]
                    message += f"; did you mean {', '.join(hints)}?"
            raise ValueError(message)
    return data


class KnownKeys(BaseModel):
    """A model whose unknown keys are refused by name, listing the valid ones (`known_keys_only`);
    `unknown_key_kind` is the word the refusal uses for a key ("field", "strategy field", …)."""

    unknown_key_kind: ClassVar[str] = "field"

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        return known_keys_only(cls, data, what=cls.unknown_key_kind)


class StrategyOptions(KnownKeys):
    """Base of every options model: unknown keys are refused, so a typo never silently does nothing."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    unknown_key_kind = "option"


class FlagsStoredWhenOn(StrategyOptions):
    """Options with flags added after runs were stored: each flag in `stored_when_on` is left out of
    the serialized options while it is off, so the options every earlier run stored (and the
    leaderboard's options key built from them) stay what they were, byte for byte."""

    stored_when_on: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _leave_out_flags_when_off(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        for name in self.stored_when_on:
            if not getattr(self, name):
                out.pop(name, None)
        return out


class NoOptions(StrategyOptions):
    """A strategy without options."""
