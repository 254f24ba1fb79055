"""`tp`: Megatron tensor parallelism — column/row-parallel attention and MLP, vocab-parallel ends.

wq/wk/wv/w1/w3 are column-parallel (dim 0 / tp), wo/w2 row-parallel (dim 1 / tp), the embedding
row-parallel over the vocabulary and the LM head column-parallel (both V/tp); the RMSNorm weights
are replicated. Every rank sees the whole batch (no data parallelism on this mesh).
"""

from __future__ import annotations

from pydantic import Field

from parallab.core.dims.tp import async_tp_field, shape_rules
from parallab.core.layout import Layout
from parallab.core.model import ModelConfig
from parallab.core.options import FlagsStoredWhenOn
from parallab.core.problems import SpecProblem, divides
from parallab.core.strategies.base import Draft, MeshDim
from parallab.core.strategies.composed import ComposedCosts


class TPOptions(FlagsStoredWhenOn):
    stored_when_on = ("async_tp",)

    sequence_parallel: bool = Field(
        False, description="Shard norms/residual over the sequence (all-gather/reduce-scatter instead of all-reduce)."
    )
    async_tp: bool = async_tp_field()


def tp_rules(model: ModelConfig, tp: int, *, sequence_parallel: bool) -> list[SpecProblem]:
    """Heads and the MLP split evenly over `tp` ranks (`shape_rules`); with SP, so does the sequence."""
    out = shape_rules(model, tp, sequence_parallel=sequence_parallel, loc=("strategy", "options"))
    if sequence_parallel:
        out += divides(("workload", "seq_len"), model.seq_len, tp, "sequence length")
    return out


class TP(ComposedCosts[TPOptions]):
    name = "tp"
    title = "Megatron column/row tensor parallel"
    options_model = TPOptions
    plan_options = ({"sequence_parallel": False}, {"sequence_parallel": True})

    def layout(self, world_size: int, options: TPOptions) -> Layout:
        return Layout(tp=world_size, sequence_parallel=options.sequence_parallel, async_tp=options.async_tp)

    def mesh(self, world_size: int, options: TPOptions) -> tuple[MeshDim, ...]:
        return (MeshDim("tp", world_size),)

    def rules(self, draft: Draft[TPOptions]) -> list[SpecProblem]:
        return tp_rules(draft.model, draft.world_size, sequence_parallel=draft.options.sequence_parallel)


DESCRIPTOR = TP()
