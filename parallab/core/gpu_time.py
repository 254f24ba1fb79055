"""The compute of one optimizer step on a GPU with a device profile (`parallab.core.device_profile`),
term by term, each with its formula and the profile entry it used (`parallab plan --explain`).

Per forward of the busiest rank (t tokens, L blocks, tensor-parallel degree tp):

- weight GEMMs: each (m, n, k) on the roofline max(2mnk / (peak × gemm share), bytes / bandwidth)
  — `Hardware.matmul_flops`; backward is twice the forward. Under fp8 the blocks' linears run on
  the fp8 peak (torchao's Float8Linear); the LM head stays 16-bit, as torchtitan leaves it.
- attention: the flash kernels' FLOPs, 2·t·ctx·(d_qk + d_v)·heads/tp × ½ (causal) forward and
  2.5× that backward (five GEMMs against two), at `attention.forward/backward[seq]` of the 16-bit peak.
- memory-bound: (a·h + b·f/tp) elements (a·h/tp under sequence parallelism) per token and block (`memory_bound.elements_per_token`),
  three passes (forward, backward twice), at `memory_bound.bandwidth_share` of the bandwidth;
  torch.compile keeps `memory_bound.compiled_share` of those bytes (fusion).
- the loss: the fp32 logits (V/tp wide under loss parallel, V otherwise) read and written three
  times; a compiled loss (one fused kernel each way) reads the 16-bit logits in forward, and reads
  them again and writes their gradient in backward: three passes of the logits' own dtype.
- fp8 casts (torchao's Float8Linear, dynamic tensorwise; torchao's float8 roofline counts the
  same casts): each linear casts its input once per forward it runs (again when recomputation
  re-runs the forward) and its output gradient once in backward — the backward's GEMMs reuse the
  fp8 input and weight the forward saved; at `fp8.activation_bytes_per_element` (× compiled_share
  under torch.compile). The weights: cast in each forward that runs; under FSDP with fp8
  all-gather (torchtitan's recipe) cast on the rank's shard (1/N of them) before each of the two
  all-gathers of a micro-step instead; at `fp8.weight_bytes_per_element`. Memory-bound.
- recomputation: selective re-runs the memory-bound ops and the attention forward (parallab's
  policy keeps every matmul's output) or, under torchtitan's policy, the memory-bound ops and the
  wk, wo and w3 GEMMs (it keeps the attention's output and every other matmul's); full the whole
  block forward.
- launches: the kernels of a step × `launch_s` (compiled: × `compiled_share`), the gap each
  kernel leaves on the device.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from parallab.core.costs import activation_dtype_bytes
from parallab.core.device_profile import DeviceProfile
from parallab.core.run_recipe import RunRecipe

if TYPE_CHECKING:
    from parallab.core.jobs import ResolvedJob

KERNELS_PER_LAYER = 90 * 2.65
"""Kernels one block launches per forward and backward (counted on `tiny`: 90 forward, 1.65× that backward)."""
RECOMPUTED_FORWARDS = {"selective": 1.0, "full": 1.0, "alternate": 0.5}
"""Share of a block's forward casts run again in backward, by recomputation mode: a selective
policy keeps the matmuls' outputs, not the fp8 casts of their inputs, so it re-runs those too."""


@dataclass(frozen=True)
class Term:
    """One part of the step: seconds per optimizer step on the busiest rank."""

    name: str
    seconds: float
    formula: str
    entry: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Shares:
    """What the step's compute is made of, per forward of one rank (from the planner's layout)."""

    tokens: int
    layers: int
    context: int
    tp: int
    forwards: int
    gemm_forward_s: float
    """Block weight GEMMs of one forward (roofline, the run's precision)."""
    head_forward_s: float
    """The LM head's GEMM of one forward (16-bit under fp8)."""
    block_weights: int
    """Block weight elements the rank multiplies (TP-local, gathered)."""
    sequence_parallel: bool = False
    """Under TP, whether the h-wide ops (norms, residual adds) run on sequence shards."""
    stream_bytes: int = 2
    """Bytes per element of the residual stream (`dims.base.residual_stream_bytes`)."""
    recomputed_gemm_forward_s: float = 0.0
    """One block's forward GEMMs the selective policy recomputes (torchtitan's: wk, wo, w3)."""


def attention_flops(job: ResolvedJob, tokens: int, context: int, tp: int) -> float:
    """Forward FLOPs of the causal attention core over every block of the rank's forward."""
    cfg = job.model
    heads = max(cfg.num_heads // tp, 1)
    return 0.5 * 2 * tokens * context * (cfg.qk_head_dim + cfg.value_head_dim) * heads


def loss_bytes_per_entry(precision: str, recipe: RunRecipe) -> int:
    """Bytes the loss moves per logit over a step's forward and backward (module docstring)."""
    return 3 * (activation_dtype_bytes(precision) if recipe.compiled_loss else 4)


def compute_terms(
    job: ResolvedJob, shares: Shares, profile: DeviceProfile, recipe: RunRecipe, *, peak16: float, bandwidth: float
) -> list[Term]:
    """The step's compute on the busiest rank, by term (module docstring)."""
    cfg, wl = job.model, job.workload
    mode, compiled, fp8 = wl.activation_checkpointing, bool(wl.compile), wl.precision == "fp8"
    t, layers, tp, n = shares.tokens, shares.layers, shares.tp, shares.forwards
    bw = bandwidth * profile.memory_bound.bandwidth_share
    fused = profile.memory_bound.compiled_share if compiled else 1.0
    act_bytes = 4 if wl.precision == "fp32" else 2

    attn_fwd = layers * attention_flops(job, t, shares.context, tp) / (peak16 * profile.attention_share(cfg.seq_len, backward=False))
    attn_bwd = layers * 2.5 * attention_flops(job, t, shares.context, tp) / (peak16 * profile.attention_share(cfg.seq_len, backward=True))
    a, b = profile.memory_bound.elements_per_token
    width = cfg.ffn_hidden_size // tp if not cfg.is_moe else cfg.expert_ffn * cfg.top_k
    # h-wide ops: on a sequence shard under SP; replicated on every TP rank without it. They run
    # on the residual stream's dtype (fp32 under autocast with fp32 weights, 16-bit under FSDP's
    # param_dtype); autocast also casts the normed input of wq, wk, wv, w1, w3 (read 4 B, write 2 B).
    h_wide = cfg.hidden_size / tp if shares.sequence_parallel else cfg.hidden_size
    casts = 5 * cfg.hidden_size * 6 if shares.stream_bytes > act_bytes else 0
    per_token = a * h_wide * shares.stream_bytes + b * width * act_bytes + casts
    mem_fwd = layers * t * per_token * profile.memory_bound.measured_factor * fused / bw
    vocab = cfg.vocab_size // tp if recipe.loss_parallel_at(tp) else cfg.vocab_size
    loss_bytes = loss_bytes_per_entry(wl.precision, recipe)
    loss = t * vocab * loss_bytes / bw if shares.head_forward_s else 0.0  # on the rank holding the head
    gemm_fwd = layers * shares.gemm_forward_s

    # selective: parallab's policy keeps every matmul and recomputes the attention; torchtitan's
    # keeps the attention and every other matmul, recomputing wk, wo and w3
    titan = recipe.selective_policy == "torchtitan_op"
    selective = mem_fwd + (layers * shares.recomputed_gemm_forward_s if titan else attn_fwd)
    recompute = {"full": gemm_fwd + attn_fwd + mem_fwd, "selective": selective}.get(mode, 0.0)
    terms = [
        Term(
            "weight GEMMs",
            n * 3 * gemm_fwd,
            "3 × L × Σ roofline(2mnk/(peak·share), bytes/bw) per forward",
            f"gemm.efficiency.{wl.precision}",
        ),
        Term("LM head GEMM", n * 3 * shares.head_forward_s, "3 × 2·t·h·V/tp / (peak·share)", "gemm.efficiency.bf16"),
        Term("attention (flash)", n * (attn_fwd + attn_bwd), "L × FLOPs_attn × (1/share_fwd + 2.5/share_bwd)", f"attention[{cfg.seq_len}]"),
        Term(
            "memory-bound ops",
            n * 3 * mem_fwd,
            "3 × L × t·(a·h·stream + b·f/tp·act + casts) × factor × compiled_share / (bw·share)",
            "memory_bound",
        ),
        Term(
            "loss (compiled)" if recipe.compiled_loss else "loss (fp32 logits)",
            n * loss,
            f"t × {'V/tp' if vocab != cfg.vocab_size else 'V'} × {loss_bytes // 3} B × 3 / (bw·share)",
            "memory_bound.bandwidth_share",
        ),
        Term(
            f"recomputation ({mode})",
            n * recompute,
            "selective: memory-bound forward + attention (parallab's policy) or wk, wo, w3 (torchtitan's); full: the block forward",
            "attention, memory_bound, gemm",
        ),
    ]
    if fp8:
        terms.append(_fp8_term(job, shares, profile, bw=bw, fused=fused))
    kernels = (
        KERNELS_PER_LAYER * layers * n * (1 + (1 if mode != "none" else 0)) * (profile.memory_bound.compiled_share if compiled else 1.0)
    )
    terms.append(Term("kernel launches", kernels * profile.launch_s, "kernels × launch_s (compiled: × compiled_share)", "launch_s"))
    return terms


def _fp8_term(job: ResolvedJob, shares: Shares, profile: DeviceProfile, *, bw: float, fused: float) -> Term:
    """torchao Float8Linear's scaling and casts per step (module docstring): the inputs in every
    forward that runs (the forward and its recomputation), the output gradients once, the weights
    per forward — or, under FSDP's fp8 all-gather, the rank's shard per all-gather."""
    cfg, mode, tp = job.model, job.workload.activation_checkpointing, shares.tp
    h, f, kv = cfg.hidden_size, cfg.ffn_hidden_size, cfg.kv_dim
    inputs = 5 * h + h / tp + f / tp  # wq, wk, wv, w1, w3 read the (gathered) normed stream; wo, w2 their local inputs
    grads = (h + 2 * kv) / tp + h + 2 * f / tp + h  # the output gradients of wq, wk, wv, wo, w1, w3, w2
    recast = RECOMPUTED_FORWARDS.get(mode, 0.0)
    per_byte = profile.fp8.activation_bytes_per_element * fused / bw
    acts = shares.layers * shares.tokens * (inputs * (1 + recast) + grads) * per_byte
    shard = job.fsdp_shards
    if shard > 1:  # cast on the shard before the forward's and the backward's all-gather
        weights = 2 * shares.block_weights / shard * profile.fp8.weight_bytes_per_element / bw
        weight_formula = "2 all-gathers × W/dp_shard·B"
    else:
        weights = (1 + recast) * shares.block_weights * profile.fp8.weight_bytes_per_element / bw
        weight_formula = "forwards run × W·B"
    return Term(
        "fp8 scaling and casts",
        shares.forwards * (acts + weights),
        f"L·t·(inputs × forwards run + output grads)·B; weights: {weight_formula}; / (bw·share)",
        "fp8",
    )
