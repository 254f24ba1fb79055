"""Model families: each declares its architecture once (`base.ModelFamily`); every formula, the
tensor-parallel plan and the pipeline split read it from here."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from parallab.core.families.base import ModelFamily, ParamCounts, Tensor
from parallab.core.families.hf import FAMILY as HF
from parallab.core.families.module import FAMILY as MODULE
from parallab.core.families.parallab import FAMILY as PARALLAB

if TYPE_CHECKING:
    from parallab.core.model import ModelConfig

FAMILIES: dict[str, ModelFamily] = {PARALLAB.name: PARALLAB, HF.name: HF, MODULE.name: MODULE}


def family_of(cfg: ModelConfig) -> ModelFamily:
    """The family that builds `cfg` (its `family` field)."""
    return FAMILIES[cfg.family]


def param_counts(cfg: ModelConfig) -> ParamCounts:
    """Exact parameter counts of the model the harness builds from `cfg`."""
    return family_of(cfg).param_counts(cfg)


def model_flops_per_token(cfg: ModelConfig) -> int:
    """Training FLOPs per token of `cfg` (its family's formula)."""
    return family_of(cfg).flops_per_token(cfg)


@functools.lru_cache(maxsize=256)
def _tensors(cfg: ModelConfig) -> tuple[Tensor, ...]:
    return tuple(family_of(cfg).tensors(cfg))


def model_tensors(cfg: ModelConfig) -> list[Tensor]:
    """Every parameter of `cfg`'s model with the dim tensor parallelism shards (listed once per
    shape: a ranking asks it of one shape for every candidate)."""
    return list(_tensors(cfg))


def tensor_count(cfg: ModelConfig) -> int:
    """How many parameter tensors `cfg`'s model has (one optimizer kernel launch each)."""
    return len(_tensors(cfg))


__all__ = [
    "FAMILIES",
    "HF",
    "MODULE",
    "PARALLAB",
    "ModelFamily",
    "ParamCounts",
    "Tensor",
    "family_of",
    "model_flops_per_token",
    "model_tensors",
    "param_counts",
    "tensor_count",
]
