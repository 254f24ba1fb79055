"""`tp`: Megatron tensor parallelism — column/row-parallel attention and MLP, vocab-parallel ends.

wq/wk/wv/w1/w3 are column-parallel (dim 0 / tp), wo/w2 row-parallel (dim 1 / tp), the embedding
row-parallel over the vocabulary and the LM head column-parallel (both V/tp); the RMSNorm weights
are replicated. Every rank sees the whole batch (no data parallelism on this mesh).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from parallab.core.costs import activation_dtype_bytes, model_tensors, numel, tp_local
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
    if sequence_parallel:
        out += divides(("workload", "seq_len"), model.seq_len, tp, "sequence length")
    return out


TP_ALL_REDUCES_PER_LAYER = 4
"""Megatron-LM (Shoeybi et al. 2019, §3; Korthikanti et al. 2022, §4.2.1): per transformer layer and
training step, one all-reduce of (b, s, h) after the attention and one after the MLP forward
(the row-parallel outputs, operator g), and one each backward (the conjugate operator f at each
block's input) — 4 all-reduces of b·s·h per layer."""


def tp_comm(cfg: ModelConfig, tokens: int, act: int, *, sequence_parallel: bool) -> dict[str, int]:
    """Megatron TP per step, for `tokens` tokens (b·s) of `act`-byte activations.

    Without SP, per layer: Megatron's 4 all-reduces of b·s·h (`TP_ALL_REDUCES_PER_LAYER`) — the
    harness prepares each attention and MLP block's input once (PrepareModuleInput), so wq/wk/wv
    and w1/w3 share one input gradient all-reduce per block. The ends, which Megatron's count
    leaves out: the vocab-parallel embedding all-reduces its output (forward, b·s·h), the
    column-parallel head all-reduces its input gradient (backward, b·s·h) and all-gathers its
    logits (forward, b·s·V — the harness takes a plain cross-entropy on replicated logits where
    Megatron fuses a vocab-parallel one). So all_reduce = (4L + 2)·b·s·h, all_gather = b·s·V.
    With SP (Korthikanti et al. 2022), per layer each all-reduce becomes a reduce-scatter plus an
    all-gather of the same buffer: 4 + 4 of b·s·h; the embedding reduce-scatters its output
    (forward) and all-gathers that gradient (backward); the head all-gathers its input
    (reduce-scatter backward) and its logits. The norm weights' gradients (replicated weights on
    a sequence shard) get no collective in the harness, so none is counted.
    """
    bsh = tokens * cfg.hidden_size * act
    logits = tokens * cfg.vocab_size * act
    layers = cfg.num_layers
    if not sequence_parallel:
        return {"all_reduce": (TP_ALL_REDUCES_PER_LAYER * layers + 2) * bsh, "all_gather": logits}
    return {"all_gather": (4 * layers + 2) * bsh + logits, "reduce_scatter": (4 * layers + 2) * bsh}


def tp_calls(cfg: ModelConfig, *, sequence_parallel: bool) -> dict[str, int]:
    """Calls per accumulation micro-step of each op of `tp_comm` (the counts its docstring gives)."""
    layers = cfg.num_layers
    if not sequence_parallel:
        return {"all_reduce": TP_ALL_REDUCES_PER_LAYER * layers + 2, "all_gather": 1}
    return {"all_gather": 4 * layers + 3, "reduce_scatter": 4 * layers + 2}


def tp_items(comm: dict[str, int], cfg: ModelConfig, *, micro_steps: int, sequence_parallel: bool, n: int) -> list[CommItem]:
    """`tp_comm`'s ops as calls: each sits between the matmuls that need it, so none hides under compute."""
    calls = tp_calls(cfg, sequence_parallel=sequence_parallel)
    return [CommItem(op, nbytes, calls[op] * micro_steps, n) for op, nbytes in comm.items()]


class TP(StrategyDescriptor[TPOptions]):
    name = "tp"
    title = "Megatron column/row tensor parallel"
    options_model = TPOptions
    dense_only = True

    def mesh(self, world_size: int, options: TPOptions) -> tuple[MeshDim, ...]:
        return (MeshDim("tp", world_size),)

    def rules(self, draft: Draft[TPOptions]) -> list[SpecProblem]:
        return tp_rules(draft.model, draft.world_size, sequence_parallel=draft.options.sequence_parallel)

    def param_elements_per_rank(self, job: ResolvedJob) -> list[int]:
        return [sum(numel(tp_local(t, job.world_size)) for t in model_tensors(job.model))]

    def comm_bytes_per_step(self, job: ResolvedJob) -> dict[str, int]:
        act = activation_dtype_bytes(job.workload.precision)
        return tp_comm(job.model, job.tokens_per_replica, act, sequence_parallel=self.opts(job).sequence_parallel)

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
