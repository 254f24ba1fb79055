"""Strategy registry: each training strategy's name → the rank module that applies it.

Every module defines a `Strategy` subclass (`workers.strategies.base`, where the entry point and
the hooks are described) and exposes an instance as `STRATEGY`. The names are the training
strategies of `parallab.core.strategies` (a test holds the two lists equal); adding a strategy is
its descriptor there plus one module here.

Composition order where strategies combine is fixed: TP, then context parallel, then FSDP or DDP
(torchtitan's). Only `hybrid` composes (TP then FSDP); the others never import each other.
"""

from __future__ import annotations

import importlib
from typing import Any

from workers.strategies.base import Applied, MicroBatch, Strategy

MODULES: dict[str, str] = {
    "single": "single",
    "ddp": "ddp",
    "fsdp": "fsdp",
    "tp": "tensor_parallel",
    "pp": "pipeline",
    "ring": "ring_attention",
    "moe": "expert_parallel",
    "hybrid": "hybrid",
}

__all__ = ["MODULES", "Applied", "MicroBatch", "Strategy", "get"]


def get(name: str) -> Strategy[Any, Any]:
    """The rank-side strategy `name` (imported on first use: a rank loads only its own)."""
    if name not in MODULES:
        raise KeyError(f"unknown training strategy {name!r}; known: {', '.join(MODULES)}")
    strategy = importlib.import_module(f"{__name__}.{MODULES[name]}").STRATEGY
    if not isinstance(strategy, Strategy) or strategy.name != name:
        raise TypeError(f"{__name__}.{MODULES[name]}.STRATEGY is not the {name!r} strategy")
    return strategy
