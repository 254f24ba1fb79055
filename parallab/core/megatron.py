"""Megatron-LM's GPT layouts, predicted only: the step time of a tensor × pipeline (× data) parallel
GPT run as Megatron-LM runs it, on a device with a profile (`parallab.core.device_profile`).

parallab's ranks do not run these layouts (sequence parallelism beside a pipeline, interleaved
stages of one layer, fp16 GPT blocks with Megatron's fused kernels and its attention-only selective
recomputation); the planner predicts them so that its step model can be held against the published
Megatron runs (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", Table 5). Every count below is the textbook one (Narayanan et al. 2021 for the GEMMs and
the pipeline, Korthikanti et al. 2022 §4 for sequence parallelism and selective recomputation);
the rates are the profile's and the catalogue's, and the communication the planner's
(`Hardware.comm_seconds`). Per micro-batch of b sequences of s tokens (t = b·s), hidden h, FFN f,
a heads, vocabulary V, tensor-parallel degree tp, one block's forward on one rank is:

- weight GEMMs: QKV (t, 3h/tp, h), the projection (t, h, h/tp), the MLP (t, f/tp, h) and (t, h, f/tp),
  each on the profile's roofline (`Hardware.matmul_flops`); backward is twice the forward.
- attention core, unfused (Megatron's 2022 kernels, no flash): QKᵀ and the values' product as a/tp
  batched (s, s, h/a) GEMMs, the full square (no causal skipping); the fused scale-mask-softmax
  reads and writes the scores (4 B per score), attention dropout reads the probabilities and writes
  them and a 1-byte mask (5 B per score).
- other memory-bound ops, Megatron's fused kernels in fp16: two LayerNorms (read and write h),
  two bias-dropout-adds (read the output and the residual, write the sum and a 1-byte mask: 7 B per
  element), the fused bias-GELU (read and write f/tp); the h-wide ones on a sequence shard (h/tp)
  under sequence parallelism. Backward moves twice the forward's bytes (three passes in all).
- tensor-parallel communication, exposed (Megatron 2022 does not overlap it): two all-reduces of
  t·h·2 B per block forward and two backward (under sequence parallelism a reduce-scatter and an
  all-gather in their place: the same bytes); sequence parallelism re-gathers each linear's input
  in backward (it stores the shard, Korthikanti §4.2.3): two more all-gathers.
- recomputation: full re-runs the block's forward and its collectives; selective (Korthikanti's
  attention-only) re-runs the attention core: its two batched GEMMs, softmax and dropout.
- the LM head on the last stage: a (t, V/tp, h) GEMM, three passes, and the fp32 loss over V/tp.
- the pipeline: each rank holds L/pp blocks in `interleave` chunks; the step is
  (m + (pp − 1)/interleave) micro-batch times of the busiest (last) rank (Narayanan et al. 2021's
  interleaved 1F1B bubble), each micro-batch adding its activations' send and receive per chunk
  forward and backward (Megatron's scatter-gather: t·h·2/tp bytes each), on the critical path.
- after the pipeline: the word embedding's gradient all-reduced between the first and last stage
  (pp > 1), the data-parallel gradient all-reduce (dp > 1), and Adam on the rank's parameters
  as Megatron's fp16 optimizer steps (`FP16_OPTIMIZER_BYTES_PER_PARAM`: 46 B per parameter — the
  unscale and inf check, the gradient norm, Adam's 28 B and the fp16 copy of the main params).
- scatter-gather (no sequence parallelism): each received 1/tp slice of the stream is all-gathered
  over the tp group before its chunk runs (Narayanan et al. 2021, §4.1), on the critical path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from parallab.core.gpu_time import Term

if TYPE_CHECKING:
    from parallab.core.plan_hardware import Hardware

FP16 = 2
"""Bytes per element of Megatron's fp16 activations, weights and collectives."""
ADAM_BYTES_PER_PARAM = 28
"""Adam's memory traffic per parameter: fp32 master, two moments read and written, the fp16 gradient read and weight written."""
FP16_OPTIMIZER_BYTES_PER_PARAM = {
    "unscale and check for inf/nan": 8,
    "gradient norm for clipping": 4,
    "Adam": ADAM_BYTES_PER_PARAM,
    "main params to fp16 model params": 6,
}
"""Megatron-LM's fp16 optimizer step per parameter (`Float16OptimizerWithFloat16Params.step`, megatron/
optimizer/optimizer.py): `_unscale_main_grads_and_check_for_nan` reads and writes the fp32 main
gradients (torch._amp_foreach_non_finite_check_and_unscale_), `clip_grad_norm` reads them once for
the norm (clip_grad 1.0, Megatron's default), apex's FusedAdam reads the fp32 param, gradient and two
moments and writes the param and moments (`ADAM_BYTES_PER_PARAM`), and
`_copy_main_params_to_model_params` reads the fp32 main param and writes the fp16 model param."""


@dataclass(frozen=True)
class MegatronLayout:
    """One Megatron-LM GPT run: the model's shape and its parallel layout."""

    hidden: int
    ffn: int
    heads: int
    layers: int
    seq_len: int
    vocab: int
    tp: int
    pp: int
    dp: int
    interleave: int
    global_batch: int
    micro_batch: int
    recompute: str
    """'full' (the whole block) or 'selective' (Korthikanti's attention-only recomputation)."""
    sequence_parallel: bool

    def problems(self) -> list[str]:
        """Why this layout cannot be predicted (empty when it can), each naming the field."""
        out = []
        if self.recompute not in ("full", "selective"):
            out.append(f"recompute: {self.recompute!r} is not 'full' or 'selective'")
        if self.layers % (self.pp * self.interleave):
            out.append(f"layers: {self.layers} is not divisible by pp × interleave = {self.pp * self.interleave}")
        if self.heads % self.tp or self.ffn % self.tp or self.vocab % self.tp:
            out.append(f"tp: {self.tp} does not divide heads ({self.heads}), ffn ({self.ffn}) and vocab ({self.vocab})")
        if self.global_batch % (self.micro_batch * self.dp):
            out.append(f"global_batch: {self.global_batch} is not a multiple of micro_batch × dp = {self.micro_batch * self.dp}")
        return out

    @property
    def micro_batches(self) -> int:
        return self.global_batch // (self.micro_batch * self.dp)


def _gemm(hw: Hardware, m: int, n: int, k: int, batch: int = 1) -> float:
    return batch * 2 * m * n * k / hw.matmul_flops("fp16", m, n, k)


def block_terms(lay: MegatronLayout, hw: Hardware) -> dict[str, float]:
    """One block's seconds per micro-batch on one rank, by part (module docstring)."""
    h, tp, s = lay.hidden, lay.tp, lay.seq_len
    t = lay.micro_batch * s
    heads = lay.heads // tp
    linears = _gemm(hw, t, 3 * h // tp, h) + _gemm(hw, t, h, h // tp) + _gemm(hw, t, lay.ffn // tp, h) + _gemm(hw, t, h, lay.ffn // tp)
    core_gemms = 2 * _gemm(hw, s, s, h // lay.heads, lay.micro_batch * heads)
    scores = (4 + 5) * t * s * heads / hw.memory_bandwidth
    h_wide = h / tp if lay.sequence_parallel else h
    elementwise = t * (2 * 2 * h_wide * FP16 + 2 * 7 * h_wide + 2 * lay.ffn / tp * FP16) / hw.memory_bandwidth
    collective = hw.comm_seconds("all_reduce", t * h * FP16, 2, tp)
    forward = linears + core_gemms + scores + elementwise
    recompute = forward + collective if lay.recompute == "full" else core_gemms + scores
    return {
        "weight GEMMs": 3 * linears,
        "attention core (unfused)": 3 * (core_gemms + scores),
        "memory-bound ops": 3 * elementwise,
        "tensor-parallel collectives": 2 * collective + (collective / 2 if lay.sequence_parallel else 0.0),
        f"recomputation ({lay.recompute})": recompute,
    }


def step_terms(lay: MegatronLayout, hw: Hardware) -> list[Term]:
    """The step on the busiest rank (the last stage), by term; raises ValueError naming a bad field."""
    if problems := lay.problems():
        raise ValueError("; ".join(problems))
    t, tp, pp, v = lay.micro_batch * lay.seq_len, lay.tp, lay.pp, lay.interleave
    per_rank = lay.layers // pp
    slots = lay.micro_batches + (pp - 1) / v
    terms = [
        Term(name, slots * per_rank * seconds, "(m + (pp−1)/v) × L/pp × per block per micro-batch", "megatron block")
        for name, seconds in block_terms(lay, hw).items()
    ]
    head = 3 * _gemm(hw, t, lay.vocab // tp, lay.hidden) + 3 * t * (lay.vocab // tp) * 4 / hw.memory_bandwidth
    terms.append(Term("LM head and loss", slots * head, "(m + (pp−1)/v) × 3 × (2·t·h·V/tp / rate + t·V/tp·4 B / bw)", "gemm, memory_bound"))
    if pp > 1:
        p2p = hw.comm_seconds("send", t * lay.hidden * FP16 // tp, 2 * v, 2, stride=tp)
        terms.append(Term("pipeline send/recv", slots * p2p, "(m + (pp−1)/v) × 2v × t·h·2/tp B / link", "inter_node_bandwidth"))
        # scatter-gather (Narayanan et al. 2021, §4.1): each received 1/tp slice is all-gathered over NVLink
        # before the chunk can run, unless sequence parallel keeps the stream sharded over tp
        if not lay.sequence_parallel:
            gather = hw.comm_seconds("all_gather", t * lay.hidden * FP16, 2 * v, tp)
            formula = "(m + (pp−1)/v) × 2v × all-gather of t·h·2 B over tp"
            terms.append(Term("pipeline scatter-gather", slots * gather, formula, "intra_node_bandwidth"))
        embedding = hw.comm_seconds("all_reduce", lay.vocab // tp * lay.hidden * FP16, 1, 2, stride=tp * pp)
        terms.append(Term("embedding gradient all-reduce", embedding, "V/tp·h·2 B, first and last stage", "inter_node_bandwidth"))
    params = (12 * per_rank * lay.hidden**2 + lay.vocab * lay.hidden) // tp
    if lay.dp > 1:
        grads = hw.comm_seconds("all_reduce", params * FP16, 1, lay.dp, stride=tp * pp)
        terms.append(Term("data-parallel all-reduce", grads, "params·2 B, ring", "inter_node_bandwidth"))
    optimizer_bytes = sum(FP16_OPTIMIZER_BYTES_PER_PARAM.values())
    terms.append(
        Term(
            "optimizer (fp16 Adam)",
            params * optimizer_bytes / hw.memory_bandwidth,
            f"params × {optimizer_bytes} B / bw (unscale 8, norm 4, Adam 28, fp16 copy 6)",
            "memory_bound",
        )
    )
    return terms


def step_seconds(lay: MegatronLayout, hw: Hardware) -> float:
    """Predicted seconds per optimizer step (the sum of `step_terms`)."""
    return sum(term.seconds for term in step_terms(lay, hw))
