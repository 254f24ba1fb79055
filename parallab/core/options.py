"""The base of every strategy's (and job kind's) options model — outside the strategies package, so
modules the strategies share (`parallab.core.interconnect`) can build on it without importing the
registry. `parallab.core.strategies.base` re-exports both names."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrategyOptions(BaseModel):
    """Base of every options model: unknown keys are refused, so a typo never silently does nothing."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class NoOptions(StrategyOptions):
    """A strategy without options."""
