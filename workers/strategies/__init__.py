"""Strategy registry: each training strategy's name → the rank module that applies it.

Every module defines a `Strategy` subclass (`workers.strategies.base`, where the entry point and
the hooks are described) and exposes an instance as `STRATEGY`. The names are the training
strategies of `parallab.core.strategies` (a test holds the two lists equal); adding a strategy is
its descriptor there plus one module here.

Every training strategy but the one-process reference is a layout, so each runs through
`compose`, the one module that combines the dimensions' modules (`ddp`, `fsdp`,
`tensor_parallel`, `pipeline`, `ring_attention`, `expert_parallel`) in one fixed order
(torchtitan's: pipeline split, TP, EP, CP, FSDP/HSDP, DDP); those never import each other.
"""

from __future__ import annotations

import importlib
from typing import Any

from parallab.core.strategies import REFERENCE_STRATEGY, TRAINING_STRATEGIES
from workers.strategies.base import Applied, MicroBatch, Strategy

MODULES: dict[str, str] = {name: "single" if name == REFERENCE_STRATEGY else "compose" for name in TRAINING_STRATEGIES}
"""Each training strategy's rank module: the reference's own, every layout's the composition."""

__all__ = ["MODULES", "Applied", "MicroBatch", "Strategy", "get"]


def get(name: str) -> Strategy[Any, Any]:
    """The rank-side strategy `name` (imported on first use: a rank loads only its own)."""
    if name not in MODULES:
        raise KeyError(f"unknown training strategy {name!r}; known: {', '.join(MODULES)}")
    module = importlib.import_module(f"{__name__}.{MODULES[name]}")
    strategy = module.STRATEGIES[name] if hasattr(module, "STRATEGIES") else module.STRATEGY
    if not isinstance(strategy, Strategy) or strategy.name != name:
        raise TypeError(f"{__name__}.{MODULES[name]}.STRATEGY is not the {name!r} strategy")
    return strategy
