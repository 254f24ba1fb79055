"""The dimensions of a layout, and the one `compose` that sums them.

`APPLY_ORDER` is the order the ranks apply them (`workers.strategies.compose`): split into
pipeline stages, TP (+SP), EP, CP, then FSDP (HSDP beside dp_replicate), then DDP — torchtitan's.
Model state is cut in that order (TP's local shard is what FSDP shards); communication, activation
effects and the bubble are each dimension's own, summed. A dimension of degree 1 adds nothing.
Adding a dimension is one module here and its step in the rank-side compose.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from parallab.core.costs import numel
from parallab.core.dims import cp, dp_replicate, dp_shard, ep, pp, tp
from parallab.core.dims.base import ActivationLayout, CommItem, Dimension, Draft, Plan
from parallab.core.layout import Layout
from parallab.core.problems import SpecProblem

if TYPE_CHECKING:
    from parallab.core.jobs import ResolvedJob

APPLY_ORDER: tuple[Dimension, ...] = (pp.DIMENSION, tp.DIMENSION, ep.DIMENSION, cp.DIMENSION, dp_shard.DIMENSION, dp_replicate.DIMENSION)
DIMENSIONS: dict[str, Dimension] = {d.name: d for d in APPLY_ORDER}

__all__ = [
    "APPLY_ORDER",
    "DIMENSIONS",
    "Composition",
    "Dimension",
    "Draft",
    "Plan",
    "compose",
    "composition_rule",
    "dense_only_dims",
    "fp8_refused_by",
    "rules",
]


def rules(draft: Draft) -> list[SpecProblem]:
    """Every on dimension's rules (a degree of 1 has none), after whether the rank side composes it
    with the others that are on."""
    return [p for dim in APPLY_ORDER if dim.degree(draft.layout) > 1 for p in (*composition_rule(dim, draft), *dim.rules(draft))]


def composition_rule(dim: Dimension, draft: Draft) -> list[SpecProblem]:
    """A problem naming `dim` and the on dimensions it does not run beside yet (`Dimension.composes_with`)."""
    layout = draft.layout
    if dim.composes_with is None:
        return []
    others = [f"{name}={layout.degrees[name]}" for name in layout.on if name != dim.name and name not in dim.composes_with]
    if not others:
        return []
    allowed = " or ".join(sorted(dim.composes_with)) or "no other dimension"
    msg = f"{dim.name}={dim.degree(layout)} is composed with {allowed} only for now, not with {' × '.join(others)}"
    return [SpecProblem((*draft.loc, dim.name), msg)]


def dense_only_dims(layout: Layout, *, routes_per_token: bool = False) -> list[str]:
    """The on dimensions that cannot split a model with experts (those that can when its family
    routes each token alone left out, `Dimension.experts_by_family`)."""
    return [
        f"{d.name}={d.degree(layout)}"
        for d in APPLY_ORDER
        if d.degree(layout) > 1 and d.dense_only and not (routes_per_token and d.experts_by_family)
    ]


def fp8_refused_by(layout: Layout) -> list[str]:
    """The on dimensions that cannot run fp8 yet."""
    return [d.name for d in APPLY_ORDER if d.degree(layout) > 1 and not d.fp8]


class Composition:
    """A job's layout with every dimension's costs summed (what a layout descriptor reports)."""

    def __init__(self, job: ResolvedJob, layout: Layout):
        self.plan = Plan(job=job, layout=layout, dims=APPLY_ORDER)

    def param_elements_per_rank(self) -> list[int]:
        """Per stage: the elements of its tensors once every dimension has taken its share."""
        return [sum(numel(s) for s in shapes) for shapes in self.plan.local_shapes()]

    def comm_items(self) -> list[CommItem]:
        return [item for dim in APPLY_ORDER for item in dim.comm(self.plan)]

    def comm_groups(self) -> list[tuple[dict[str, int], int]]:
        """Each on dimension's bytes by op, with its group's size (for the busbw factor of each)."""
        out = []
        for dim in APPLY_ORDER:
            items = dim.comm(self.plan)
            by_op: dict[str, int] = {}
            for item in items:
                by_op[item.op] = by_op.get(item.op, 0) + item.bytes_per_step
            if items:
                out.append((by_op, dim.degree(self.plan.layout)))
        return out

    def comm_bytes_per_step(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for item in self.comm_items():
            out[item.op] = out.get(item.op, 0) + item.bytes_per_step
        return dict(sorted(out.items()))

    def activation_layouts(self, base: ActivationLayout) -> list[ActivationLayout]:
        layouts = [base]
        for dim in APPLY_ORDER:
            layouts = dim.activations(self.plan, layouts)
        return layouts

    def bubble_fraction(self) -> float | None:
        return next((b for dim in APPLY_ORDER if (b := dim.bubble(self.plan)) is not None), None)


def compose(job: ResolvedJob, layout: Layout) -> Composition:
    """The sum of `layout`'s dimensions for `job`."""
    return Composition(job, layout)
