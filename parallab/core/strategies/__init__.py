"""The strategy registry: every name a job spec may carry, mapped to its descriptor.

Every training strategy but the one-process reference is a preset of a layout
(`layout.LayoutDescriptor`: its options fill a `Layout`); `layout` is any layout written out. Its
mesh, batch split, rules and costs — model state, communication, activations, the bubble — are the
composed dimensions' (`parallab.core.dims`), so a formula or a rule is written once, in its
dimension's module, and the mesh's dims are named by one vocabulary
(`parallab.core.layout.MeshAxisName`); a preset keeps its options, their defaults and what it
requires of its degrees. `single`, `collectives` and `calibrate` have no layout: no mesh.

Adding a preset is one options model and descriptor here; the ranks run it through the one
composition (`workers.strategies.compose`). Everything that lists strategies — the spec's enum,
the form, the CLI's help, prediction, the rank side — reads this registry.
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
