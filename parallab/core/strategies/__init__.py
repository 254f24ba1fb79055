"""The strategy registry: every name a job spec may carry, mapped to its descriptor.

Every training strategy is a preset of a layout (`StrategyDescriptor.layout`); `layout` is any
layout written out. Each of them takes all its costs — model state, communication, activations,
the bubble — from the composed dimensions (`parallab.core.dims`, through `composed.ComposedCosts`),
so a formula is written once, in its dimension's module; a descriptor keeps its options, mesh and
rules.

Adding a strategy is one descriptor module here (options, mesh, rules, costs) and one rank
module in `workers/strategies/` (apply it to a model on a mesh); everything that lists
strategies — the spec's enum, the form, the CLI's help, prediction — reads this registry.
"""

from __future__ import annotations

from typing import Any

from parallab.core.layout import Layout
from parallab.core.strategies import calibrate, collectives, ddp, fsdp, hsdp, hybrid, layout, moe, pp, ring, single, three_d, tp
from parallab.core.strategies.base import StrategyDescriptor

REGISTRY: dict[str, StrategyDescriptor[Any]] = {
    d.name: d
    for d in (
        single.DESCRIPTOR,
        ddp.DESCRIPTOR,
        fsdp.DESCRIPTOR,
        tp.DESCRIPTOR,
        pp.DESCRIPTOR,
        ring.DESCRIPTOR,
        moe.DESCRIPTOR,
        hybrid.DESCRIPTOR,
        hsdp.DESCRIPTOR,
        three_d.DESCRIPTOR,
        layout.DESCRIPTOR,
        collectives.DESCRIPTOR,
        calibrate.DESCRIPTOR,
    )
}
"""Names are contractual (specs, results and URLs use them); their order is the form's and the help's."""

STRATEGY_NAMES: tuple[str, ...] = tuple(REGISTRY)
REFERENCE_STRATEGY: str = single.DESCRIPTOR.name
"""The one-process reference every run's loss and gradients are held against."""
TRAINING_STRATEGIES: tuple[str, ...] = tuple(name for name, d in REGISTRY.items() if d.trains)


def layout_of(name: str, world_size: int, options: dict[str, Any]) -> Layout | None:
    """The layout a strategy block (a spec's, or a stored or uploaded result's) resolves to; None
    for an unknown name, options that do not parse, or a job kind that trains nothing."""
    descriptor = REGISTRY.get(name)
    if descriptor is None:
        return None
    try:
        parsed = descriptor.complete_options(descriptor.parse_options(options), world_size)
    except ValueError:  # pydantic's ValidationError included
        return None
    layout: Layout | None = descriptor.layout(world_size, parsed)
    return layout


def get_descriptor(name: str) -> StrategyDescriptor[Any]:
    """The descriptor of `name` (KeyError naming the known ones otherwise)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown strategy {name!r}; known: {', '.join(REGISTRY)}") from None
