"""`tp`: Megatron tensor parallelism — column/row-parallel attention and MLP, vocab-parallel ends;
every rank on tp (`parallab.core.dims.tp`: its shape rules, costs and the plan's description).

wq/wk/wv/w1/w3 are column-parallel (dim 0 / tp), wo/w2 row-parallel (dim 1 / tp), the embedding
row-parallel over the vocabulary and the LM head column-parallel (both V/tp); the RMSNorm weights
are replicated. Every rank sees the whole batch (no data parallelism on this mesh).
"""

from __future__ import annotations

from pydantic import Field

from parallab.core.dims.tp import async_tp_field
from parallab.core.layout import MeshAxisName
from parallab.core.options import FlagsStoredWhenOn
from parallab.core.strategies.layout import LayoutDescriptor, OneAxisOptions


class TPOptions(FlagsStoredWhenOn, OneAxisOptions):
    axis = MeshAxisName.TP
    stored_when_on = ("async_tp",)

    sequence_parallel: bool = Field(
        False, description="Shard norms/residual over the sequence (all-gather/reduce-scatter instead of all-reduce)."
    )
    async_tp: bool = async_tp_field()


class TP(LayoutDescriptor[TPOptions]):
    name = "tp"
    title = "Megatron column/row tensor parallel"
    options_model = TPOptions
    plan_options = ({"sequence_parallel": False}, {"sequence_parallel": True})


DESCRIPTOR = TP()
