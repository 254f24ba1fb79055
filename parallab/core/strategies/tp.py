"""`tp`: Megatron tensor parallelism — column/row-parallel attention and MLP, vocab-parallel ends.

wq/wk/wv/w1/w3 are column-parallel (dim 0 / tp), wo/w2 row-parallel (dim 1 / tp), the embedding
row-parallel over the vocabulary and the LM head column-parallel (both V/tp); the RMSNorm weights
are replicated. Every rank sees the whole batch (no data parallelism on this mesh).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from parallab.core.dims.tp import shape_rules
from parallab.core.layout import Layout
from parallab.core.model import ModelConfig
from parallab.core.problems import SpecProblem, divides
from parallab.core.strategies.base import Draft, MeshDim, StrategyOptions
from parallab.core.strategies.composed import ComposedCosts


class TPOptions(StrategyOptions):
    sequence_parallel: bool = Field(
        False, description="Shard norms/residual over the sequence (all-gather/reduce-scatter instead of all-reduce)."
    )
    async_tp: bool = Field(
        False,
        description=(
            "tp: async TP (torchtitan's enable_async_tensor_parallel); predicted only and not modelled — "
            "TP's collectives are timed exposed."
        ),
    )

    @model_serializer(mode="wrap")
    def _leave_out_async_tp_when_off(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """`async_tp` only where it is on: stored options stay what they were for every run without it."""
        out: dict[str, Any] = handler(self)
        if not self.async_tp:
            out.pop("async_tp", None)
        return out


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
