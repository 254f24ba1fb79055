"""`ring`: context parallelism — the sequence sharded over a ring, K/V passed around, causal.

Everything outside attention is replicated; each rank's loss covers its 1/n of the tokens, and
the gradients are averaged over the ring in one all-reduce.
"""

from __future__ import annotations

from pydantic import Field

from parallab.core.layout import Layout
from parallab.core.problems import SpecProblem, divides
from parallab.core.strategies.base import Draft, MeshDim, StrategyOptions
from parallab.core.strategies.composed import ComposedCosts


class RingOptions(StrategyOptions):
    zigzag: bool = Field(False, description="Load-balanced causal sharding: each rank holds chunks i and 2n−1−i.")


class Ring(ComposedCosts[RingOptions]):
    name = "ring"
    title = "context parallel ring attention"
    options_model = RingOptions
    dense_only = True
    plan_options = ({"zigzag": False}, {"zigzag": True})

    def layout(self, world_size: int, options: RingOptions) -> Layout:
        return Layout(cp=world_size, zigzag=options.zigzag)

    def mesh(self, world_size: int, options: RingOptions) -> tuple[MeshDim, ...]:
        return (MeshDim("cp", world_size),)

    def rules(self, draft: Draft[RingOptions]) -> list[SpecProblem]:
        zigzag = draft.options.zigzag
        what = "sequence length" + (" (zig-zag needs 2 × ring size)" if zigzag else "")
        return divides(("workload", "seq_len"), draft.model.seq_len, draft.world_size * (2 if zigzag else 1), what)


DESCRIPTOR = Ring()
