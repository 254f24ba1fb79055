"""`tp`: Megatron tensor parallelism — column/row-parallel attention and MLP, vocab-parallel ends.

wq/wk/wv/w1/w3 are column-parallel (dim 0 / tp), wo/w2 row-parallel (dim 1 / tp), the embedding
row-parallel over the vocabulary and the LM head column-parallel (both V/tp); the RMSNorm weights
are replicated. Every rank sees the whole batch (no data parallelism on this mesh).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from parallab.core.costs import activation_dtype_bytes, model_tensors, numel, tp_local
from parallab.core.dims.base import residual_stream_bytes
from parallab.core.dims.tp import norm_grad_bytes, shape_rules, tp_comm, tp_items
from parallab.core.layout import Layout
from parallab.core.model import ModelConfig
from parallab.core.problems import SpecProblem, divides
from parallab.core.strategies.base import ActivationLayout, CommItem, Draft, MeshDim, StrategyDescriptor, StrategyOptions

if TYPE_CHECKING:
    from parallab.core.jobs import ResolvedJob


class TPOptions(StrategyOptions):
    sequence_parallel: bool = Field(
        False, description="Shard norms/residual over the sequence (all-gather/reduce-scatter instead of all-reduce)."
    )


def tp_rules(model: ModelConfig, tp: int, *, sequence_parallel: bool) -> list[SpecProblem]:
    """Heads and the MLP split evenly over `tp` ranks; with SP, so does the sequence."""
    out = divides(("workload", "num_heads"), model.num_heads, tp, "heads")
    out += divides(("workload", "ffn_hidden_size"), model.ffn_hidden_size, tp, "ffn hidden size")
    out += shape_rules(model, tp)
    if sequence_parallel:
        out += divides(("workload", "seq_len"), model.seq_len, tp, "sequence length")
    return out


class TP(StrategyDescriptor[TPOptions]):
    name = "tp"
    title = "Megatron column/row tensor parallel"
    options_model = TPOptions
    dense_only = True
    plan_options = ({"sequence_parallel": False}, {"sequence_parallel": True})

    def layout(self, world_size: int, options: TPOptions) -> Layout:
        return Layout(tp=world_size, sequence_parallel=options.sequence_parallel)

    def mesh(self, world_size: int, options: TPOptions) -> tuple[MeshDim, ...]:
        return (MeshDim("tp", world_size),)

    def rules(self, draft: Draft[TPOptions]) -> list[SpecProblem]:
        return tp_rules(draft.model, draft.world_size, sequence_parallel=draft.options.sequence_parallel)

    def param_elements_per_rank(self, job: ResolvedJob) -> list[int]:
        return [sum(numel(tp_local(t, job.world_size)) for t in model_tensors(job.model))]

    def comm_bytes_per_step(self, job: ResolvedJob) -> dict[str, int]:
        act = activation_dtype_bytes(job.workload.precision)
        stream = residual_stream_bytes(job.workload.precision, fsdp=False)
        grad = norm_grad_bytes(job.workload.precision, fsdp=False)
        sp = self.opts(job).sequence_parallel
        return tp_comm(job.model, job.tokens_per_replica, act, sequence_parallel=sp, grad_bytes=grad, stream=stream)

    def comm_items(self, job: ResolvedJob) -> list[CommItem]:
        sp = self.opts(job).sequence_parallel
        return tp_items(self.comm_bytes_per_step(job), job.model, micro_steps=job.accum_steps, sequence_parallel=sp, n=job.world_size)

    def activation_layout(self, job: ResolvedJob) -> ActivationLayout:
        tokens = job.micro_batch_size * job.model.seq_len
        return ActivationLayout(
            tokens=tokens,
            layers=job.model.num_layers,
            head_tokens=tokens,
            tp=job.world_size,
            sequence_parallel=self.opts(job).sequence_parallel,
        )


DESCRIPTOR = TP()
