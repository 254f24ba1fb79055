"""Activation memory per layer: Korthikanti et al. 2022's formulas, and the same count for our model.

## The paper

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models" (§4,
Table 2), count the bytes one GPT layer keeps for its backward pass: s tokens per sequence, b
sequences, hidden size h, a heads, tensor-parallel degree t. Their convention: every activation
in 16 bits (2 bytes), every dropout mask 1 byte, a 4h-wide GELU MLP, LayerNorm, and attention
that materialises the a·s·s scores:

    attention      11sbh + 5as²b   QKV input 2, Q and K 4, softmax output 2as²b, its dropout mask
                                   as²b, the dropout output 2as²b, V 2, projection input 2, mask 1
    MLP            19sbh           input 2, GELU input 8, GELU output 8, dropout mask 1
    2 LayerNorms   4sbh            their inputs
    per layer      sbh(34 + 5as/h)
    TP (t ranks)   sbh(10 + 24/t + 5as/(ht))   the norms, the QKV and MLP inputs and two masks
                                               stay replicated
    TP + SP        sbh(34/t + 5as/(ht))
    selective      the 5as/h term goes (the core attention is recomputed):
                   sbh·34, sbh(10 + 24/t), sbh·34/t
    full           2sbh per layer (each layer's input), plus one layer's full set while it is
                   recomputed in backward

A pipeline multiplies the per-layer figure by the micro-batches in flight on a stage: all m for
GPipe, p − s on stage s of 1F1B (so p on the first stage: L layers' worth, the paper's §4.2.3).

## Our model (`workers.harness.model`)

The same count for what autograd saves in our Llama-style block, per token and layer, in bytes;
a = 2 under bf16/fp16 autocast, 4 in fp32. Checked term by term against
`torch.autograd.graph.saved_tensors_hooks` (tests/core/test_activations.py: within 1% for
`tiny` and `small`, dense and MoE, fp32 and bf16; fp32: 4(10h + 4f + A + 2) per token, bf16:
34h + 8f + 4A + 8 plus the weight copies).

- No dropout, so no masks; torch's SDPA is flash-style on CPU and GPU, so there are no s² scores
  — only one fp32 logsumexp per head and token (4A). The paper's 5as/h term is absent here.
- Two RMSNorms, each keeping its input and its normalised value before the weight, both fp32
  (under autocast the residual stream stays fp32: an fp32 embedding plus 16-bit block outputs
  promotes to fp32), and a 1-element rsqrt: 2·(8h + 4).
- The inputs of the projections that read a norm: in fp32 one tensor per norm, shared by its
  linears (2·4h); under autocast each linear casts its input on its own (autocast caches only
  the casts of leaf weights), so wq, wk, wv, w1 and w3 keep five copies (5ah).
- Attention: q and k after rotary, v and the output (4ah); rotary itself keeps nothing (its
  cos/sin tables need no gradient).
- SwiGLU: w1's output, silu's output, w3's output and their product (4af) — where the paper's
  GELU MLP keeps two 4h tensors, ours keeps four f-wide ones.
- Under autocast, the 16-bit copies of the layer's weights, (4h² + 3hf)·a per layer (not per
  token): autocast caches each weight's cast for the whole forward/backward region, checkpointed
  or not. FSDP with a 16-bit param_dtype gathers 16-bit weights and casts nothing.

In the paper's notation, one bf16 layer keeps sbh(34 + 8f/h) + 4sbA bytes (+ the weight
copies): the fp32 norms and the five input copies (16 + 10 = 26) and q, k, v, o (8) make 34,
the SwiGLU 8f/h (≈ 21.3 at f = 8h/3), and no score term.

The paper's 34, term by term, for our block with a GELU MLP at f = 4h (GPT-3's shape) in bf16:
attention 11 → 14 (q, k, v, o 8 as theirs; the input 2 → 6, one cast copy for each of wq, wk,
wv; no dropout mask −1), MLP 19 → 18 (input 2, w1's output 8 and GELU's 8 as theirs, no mask
−1), norms 4 → 16 (input and normalised value both fp32, 8 each): 48, plus 4A/h for the
logsumexp where theirs has 5as/h. So our `none` already lacks what their selective mode
recomputes, and Korthikanti's selective applied to this block (recompute the core attention)
saves only the logsumexp: 4A/h of 48 + 4A/h, 0.07 % for GPT-3 175B, against their 80/114 = 70 %.
Our `selective` is op level instead and keeps 22 of the 48 (the fp32 input 4; the outputs of wq,
wk, wv, wo and w2, 2 each, and w1's, 8): it saves 54 % for that shape.

- TP without SP splits q, k, v, o, the logsumexp, the MLP and the weight copies by t; the norms
  and the projection inputs stay replicated.
- SP splits the norms too, not the projection inputs: torch's SequenceParallel all-gathers the
  norm's output and the linears save the gathered tensor (Megatron saves its shard and gathers
  again in backward, which is why the paper's SP form divides everything by t).
- Selective recomputation is op level (`workers.harness.model`: torch's policy API keeps every
  matmul's output and every functional collective's, and recomputes the rest — norms, rotary,
  SDPA, SwiGLU's activation and product). Korthikanti's principle (recompute what costs memory
  but few FLOPs) with their selective mode's own bookkeeping: what a block keeps is its input
  (the residual stream, as under full recomputation) and the outputs of its kept ops — wq, wk,
  wv and wo, w1 and w3 (f/tp wide), w2 — in the compute dtype, plus, under tensor parallelism,
  the all-reduced outputs of wo and w2; MoE blocks keep the router's and each routed row's
  expert matmul outputs. In backward one block's full set exists while it is recomputed, as
  under full recomputation. (The count that kept every tensor but the logsumexp described
  Korthikanti's attention-only mode, which this harness does not run: a fused SDPA stores no
  s² scores, so recomputing it alone would save nothing.)
  A published run's own policy is counted where the row names it (`SELECTIVE_POLICIES`):
  torchtitan's keeps every other matmul of a block (wq, wv, w1, w2), the flash attention's output
  and logsumexp and the reduce-scatters' outputs, and recomputes wk, wo and w3.
- Full recomputation keeps each block's input, the fp32 residual stream (4h; 4h/t under SP),
  and one layer's full set for one micro-batch while it is recomputed.
- The peak (`parallab.core.prediction`). Without recomputation it is the head's backward: every
  block's full set and the head's tensors, with the logits' gradient beside them — made in
  backward, a temporary, so it is not counted among the activations
  (`backward_temporary_bytes_per_rank`; the memory fit adds it). Under recomputation it is the
  larger of that moment and a block's recomputation, after the head's tensors are freed (every
  kept set plus one block's full set less its own kept set), never both.
- Not counted: the rotary tables (cos and sin, 4·head_dim bytes per position, shared by every
  block: 4 KiB on `tiny`).
- MoE layers replace the MLP terms: the router's input copy (autocast) and its fp32
  probabilities (4E) and top-k indices (8k), and per routed row (top_k rows per token, drops
  ignored) the expert input (fp32: 4h, shared by w1 and w3; autocast: 2ah), the SwiGLU terms
  (4af), the expert output put back in token order and its gated product (2ah: the gate's
  multiply and index_add keep them), the gate (a) and three int64 indices and a bool mask (25).
- Architecture options (each checked against autograd like the rest): grouped-query attention
  keeps the same 4ah — K and V are repeated to the query heads before SDPA (torchtitan's
  `repeat_kv`), and SDPA keeps the repeated ones, so only the weights and their copies shrink
  (2h² + 2h·kv_dim); a GELU MLP keeps w1's output and GELU's (2af) and casts its input once; the
  shared experts keep their own MLP's terms on every token; an MoE model's dense first blocks are
  counted as the average block (each kind weighted by its share of the L blocks).
- The LM head (on its rank): the final norm (8h + 4; 1/tp of it under SP, which shards the final
  norm over the sequence as it does the blocks'), its projection input (4h fp32 or ah, the whole
  gathered sequence) and the fp32 log-softmax the loss keeps (4V) per token; in backward, the
  logits' gradient (4V) of one micro-batch on top — beside it at the loss's backward peak one
  more logits-wide fp32 tensor, or two under loss parallel (`loss_backward_temporaries`).
- A compiled loss (torch.compile over the cross-entropy with its fp32 upcast, as torchtitan
  compiles it with the model since April 2025; parallab's `compile` compiles the blocks only):
  inductor fuses the upcast, log-softmax and nll_loss into reductions over the vocabulary, so
  what the forward saves for the backward is its input, the 16-bit logits (aV), and a few fp32
  numbers a token (the row's max and log-sum-exp), and the backward's one fused kernel writes the
  logits' gradient in their dtype (aV) with no fp32 tensor beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from parallab.core.costs import activation_dtype_bytes
from parallab.core.families.base import attention_params
from parallab.core.model import ModelConfig
from parallab.core.problems import RecipeError

Recompute = Literal["none", "selective", "full"]
RESIDUAL_BYTES = 4
"""The residual stream, the norms' math and the log-softmax are fp32 in every precision."""


# ---- the paper ----


def korthikanti_layer_bytes(
    *, s: int, b: int, h: int, a: int, t: int = 1, sequence_parallel: bool = False, recompute: Recompute = "none"
) -> float:
    """Bytes one GPT layer keeps for backward (Korthikanti et al. 2022, Table 2): 16-bit
    activations, 1-byte dropout masks, a 4h GELU MLP and materialised attention scores."""
    sbh = s * b * h
    if recompute == "full":
        return 2.0 * sbh
    scores = 0.0 if recompute == "selective" else 5 * a * s / (h * t)
    if sequence_parallel:
        return sbh * (34 / t + scores)
    if t > 1:
        return sbh * (10 + 24 / t + scores)
    return sbh * (34 + scores)


# ---- our model ----


@dataclass(frozen=True)
class Term:
    """One tensor (or a group of like tensors) a layer keeps for backward, per token, on one rank."""

    name: str
    bytes_per_token: float
    core_attention: bool = False
    """Kept by the core attention itself: what Korthikanti's selective recomputation drops."""


def _mixed(dense: list[Term], moe: list[Term], cfg: ModelConfig) -> list[Term]:
    """The average block of a model whose first blocks are dense: each kind's terms weighted by its
    share of the blocks, so L × the average is the exact sum over the blocks."""
    m, n = cfg.moe_layers, cfg.num_layers
    if m == n:
        return moe
    scaled = [Term(f"dense blocks ({n - m}/{n}): {t.name}", t.bytes_per_token * (n - m) / n, t.core_attention) for t in dense]
    return scaled + [Term(f"MoE blocks ({m}/{n}): {t.name}", t.bytes_per_token * m / n, t.core_attention) for t in moe]


def layer_terms(
    cfg: ModelConfig, precision: str, *, tp: int = 1, sequence_parallel: bool = False, params_16bit: bool = False
) -> list[Term]:
    """What one block of our model keeps per token on one rank (see the module docstring), the
    average block when an MoE model's first blocks are dense; `params_16bit`: the block computes
    with 16-bit parameters (FSDP's param_dtype), so its residual stream is 16-bit and its
    projections share their inputs."""
    dense = _block_terms(cfg, precision, moe=False, tp=tp, sequence_parallel=sequence_parallel, params_16bit=params_16bit)
    if not cfg.is_moe:
        return dense
    moe = _block_terms(cfg, precision, moe=True, tp=tp, sequence_parallel=sequence_parallel, params_16bit=params_16bit)
    return _mixed(dense, moe, cfg)


def _qkvo_width(cfg: ModelConfig) -> int:
    """Per token, the widths of q, k, v and the attention's output together: 4h for multi-head
    attention (A heads of h/A each), A·(2(d_h + d_R) + 2·d_v) under multi-head latent attention,
    whose query and key heads are d_h + d_R wide and value heads d_v (the latent itself, d_c + d_R
    per token, and its norm are not counted: an approximation for the hf family's DeepSeek-V2)."""
    return cfg.num_heads * (2 * cfg.qk_head_dim + 2 * cfg.value_head_dim)


def _mla_bytes(cfg: ModelConfig, a: int) -> float:
    """Per token, what DeepSeek-V2's latent attention keeps besides q, k, v and the output (the
    library's `DeepseekV2Attention`, read for what backward saves): q_proj's output A·(d_h + d_R)
    (the query concatenated after rotary is another tensor); the rotary inputs as complex pairs,
    A·d_R for the query and d_R for the shared key; kv_a_proj_with_mqa's output d_c + d_R (the
    latent norm's input is a view of it), the normalised latent d_c (kv_b's input) and the norm's
    rsqrt (fp32); kv_b_proj's output is A·(d_h + d_v), of which the value (counted) is a view, so
    its key half A·d_h stays too; a compressed query adds q_a's output and its normalised copy
    (2·d_c') and a second rsqrt."""
    heads, q_rank = cfg.num_heads, cfg.q_lora_rank
    elements = (
        heads * cfg.qk_head_dim
        + heads * cfg.qk_rope_head_dim
        + cfg.qk_rope_head_dim
        + cfg.kv_lora_rank
        + cfg.qk_rope_head_dim
        + cfg.kv_lora_rank
        + heads * cfg.qk_nope_head_dim
        + 2 * q_rank
    )
    return a * elements + RESIDUAL_BYTES * (2 if q_rank else 1)


def _mlp_terms(cfg: ModelConfig, a: int, *, width: int, tp: int, autocast: bool, shared: bool) -> tuple[float, float]:
    """(input copies, interior) bytes per token of one dense MLP of inner width `width`: SwiGLU's
    w1 and w3 each cast their input under autocast and keep w1 out, silu out, w3 out and the
    product (4af); GELU's w1 casts once and keeps w1 out and gelu out (2af)."""
    h = cfg.hidden_size
    readers = 2 if cfg.mlp == "swiglu" else 1
    inputs = (a * h if shared else readers * a * h) if autocast else RESIDUAL_BYTES * h
    return inputs, 2 * readers * a * width / tp


def _block_terms(
    cfg: ModelConfig, precision: str, *, moe: bool, tp: int = 1, sequence_parallel: bool = False, params_16bit: bool = False
) -> list[Term]:
    a = activation_dtype_bytes(precision)
    autocast = a != RESIDUAL_BYTES
    shared = params_16bit and autocast
    h, f, heads = cfg.hidden_size, cfg.ffn_hidden_size, cfg.num_heads
    norm_split = tp if sequence_parallel else 1
    attention_inputs = (a * h if shared else 3 * a * h) if autocast else RESIDUAL_BYTES * h
    normalised = a * h if shared else RESIDUAL_BYTES * h
    terms = [
        Term("norms: fp32 inputs, normalised values, rsqrt", 2 * (RESIDUAL_BYTES * h + normalised + RESIDUAL_BYTES) / norm_split),
        Term("attention: q, k (after rotary), v, output", a * _qkvo_width(cfg) / tp),
        Term("attention: logsumexp (fp32, one per head)", RESIDUAL_BYTES * heads / tp, core_attention=True),
    ]
    if cfg.is_mla:
        terms.append(Term("latent attention: q before rotary, latent, its norm, kv_b's key half, rotary inputs", _mla_bytes(cfg, a)))
    if not moe:
        mlp_inputs, mlp = _mlp_terms(cfg, a, width=f, tp=tp, autocast=autocast, shared=shared)
        terms += [
            Term("projection inputs (wq, wk, wv, MLP)", attention_inputs + mlp_inputs),
            Term(f"{cfg.mlp} MLP interior", mlp),
        ]
        return terms
    k, e = cfg.top_k, cfg.num_experts
    router_input = a * h if autocast else RESIDUAL_BYTES * h
    expert_input, expert = _mlp_terms(cfg, a, width=cfg.expert_ffn, tp=1, autocast=autocast, shared=shared)
    terms += [
        Term("projection inputs (wq, wk, wv, router)", attention_inputs + router_input),
        Term("router: probabilities (fp32), top-k indices", RESIDUAL_BYTES * e + 8 * k),
        Term("experts: routed rows' inputs, MLP interiors, outputs, gates, indices", k * (expert_input + expert + 2 * a * h + a + 25)),
    ]
    if cfg.num_shared_experts:
        # in fp32 the shared MLP reads the very tensor the router keeps: no input of its own
        shared_input, shared_mlp = _mlp_terms(cfg, a, width=cfg.num_shared_experts * cfg.expert_ffn, tp=1, autocast=autocast, shared=shared)
        terms.append(Term("shared experts: input copies, MLP interior", (shared_input if autocast else 0.0) + shared_mlp))
    return terms


def weight_copy_bytes(cfg: ModelConfig, precision: str, *, tp: int = 1, experts_local: int | None = None) -> int:
    """Autocast's 16-bit copies of one block's weights (0 in fp32), held for the whole step."""
    a = activation_dtype_bytes(precision)
    if a == RESIDUAL_BYTES:
        return 0
    h, f, m = cfg.hidden_size, cfg.ffn_hidden_size, cfg.mlp_matrices
    attention = attention_params(cfg) if cfg.is_mla else 2 * h * h + 2 * h * cfg.kv_dim
    dense = a * (attention + m * h * f) // tp
    if not cfg.is_moe:
        return dense
    local = cfg.num_experts if experts_local is None else experts_local
    moe = a * (attention // tp + m * h * cfg.expert_ffn * (local + cfg.num_shared_experts) + h * cfg.num_experts)
    return (dense * (cfg.num_layers - cfg.moe_layers) + moe * cfg.moe_layers) // cfg.num_layers


def checkpoint_input_bytes(
    cfg: ModelConfig, *, tp: int = 1, sequence_parallel: bool = False, precision: str = "fp32", params_16bit: bool = False
) -> float:
    """Per token, what full recomputation keeps of a block: its input, the residual stream (fp32;
    16-bit when the block computes with 16-bit parameters)."""
    stream = activation_dtype_bytes(precision) if params_16bit else RESIDUAL_BYTES
    return min(stream, RESIDUAL_BYTES) * cfg.hidden_size / (tp if sequence_parallel else 1)


def head_bytes_per_token(
    cfg: ModelConfig,
    precision: str,
    *,
    params_16bit: bool = False,
    tp: int = 1,
    sequence_parallel: bool = False,
    compiled_loss: bool = False,
) -> tuple[float, float]:
    """(kept per token through the step, the logits' gradient per token of the micro-batch in backward).

    Under sequence parallelism the final norm runs on the rank's sequence shard (torch's
    SequenceParallel style on it, in torchtitan's plan and parallab's alike), so what it keeps — its
    fp32 input, the normalised value the weight multiplies and the rsqrt (the eager RMSNorm:
    `x.float()`, `x * rsqrt(mean(x²) + eps)`, `.type_as(x) * weight`) — is 1/tp of a token's, as the
    blocks' norms are; the head's input is the all-gathered sequence (ColwiseParallel's input
    preparation), which its matmul keeps whole. A compiled loss keeps the logits in their dtype
    and makes their gradient in it (module docstring)."""
    a = activation_dtype_bytes(precision)
    h, v = cfg.hidden_size, cfg.vocab_size
    head_input = RESIDUAL_BYTES * h if a == RESIDUAL_BYTES else a * h
    normalised = a * h if (params_16bit and a != RESIDUAL_BYTES) else RESIDUAL_BYTES * h
    norm_split = tp if sequence_parallel and tp > 1 else 1
    vocab = a if compiled_loss else RESIDUAL_BYTES  # the saved logits or the kept fp32 log-softmax; their gradient's
    kept = (RESIDUAL_BYTES * h + normalised + RESIDUAL_BYTES) / norm_split + head_input + vocab * v
    return kept, vocab * v


def loss_backward_temporaries(*, loss_parallel: bool = False, compiled_loss: bool = False) -> int:
    """How many logits-wide tensors the loss's backward holds beside what the loss kept at its
    peak (each the size of the logits' gradient, V/tp wide under loss parallel).

    - Cross-entropy on whole logits: aten's nll_loss_backward makes a dense gradient (zeros with
      −1 scattered at the targets) and _log_softmax_backward_data makes log-softmax's own gradient
      from it and the kept output: 2.
    - Under loss parallel (torch's `torch.distributed.tensor.parallel.loss_parallel`, which
      torchtitan turns on with TP): `_nll_loss_and_log_softmax_backward` fuses both backwards as
      `grad_input = zeros_like(x)` (scattered), then `(grad_input + torch.exp(x)) * grad_output`
      — while the sum is made, `grad_input`, `exp(x)` and the sum are alive beside x (the kept
      log-softmax), and then `grad_input`, the sum and the product: 3 (its log-softmax backward
      handler only casts). The same body in torch before and after the published runs' commit.
    - A compiled loss on whole logits: the fused backward's output, the gradient itself: 1."""
    if compiled_loss and loss_parallel:
        raise RecipeError("compiled_loss", COMPILED_UNDER_LOSS_PARALLEL)
    return 1 if compiled_loss else 3 if loss_parallel else 2


def per_token_bytes(terms: list[Term], recompute: Recompute) -> float:
    """Bytes per token of one layer's full set (Korthikanti's attention-only selective mode: less
    what the core attention keeps for itself)."""
    return sum(t.bytes_per_token for t in terms if not (recompute == "selective" and t.core_attention))


SELECTIVE_POLICIES = {
    "every_matmul": "parallab's harness: every matmul's and collective's output kept, the rest recomputed",
    "torchtitan_op": "torchtitan's op-level policy (parallelize_llama.py, _save_list at 9dec370): every other matmul "
    "of a block kept (wq, wv, w1, w2; wk, wo, w3 recomputed), the flash attention's output and logsumexp, and the "
    "reduce-scatters' outputs",
}
"""Selective recomputation policies the planner counts: parallab's own, and the one a published run used."""
COMPILED_UNDER_LOSS_PARALLEL = "a compiled loss under loss parallel is not modelled"
"""Why a compiled loss beside loss parallel is refused (`loss_backward_temporaries`, `run_recipe.RunRecipe`)."""


def check_selective_policy(policy: str) -> None:
    """A RecipeError naming the field where `policy` is not one of `SELECTIVE_POLICIES`."""
    if policy not in SELECTIVE_POLICIES:
        raise RecipeError("selective_policy", f"{policy!r} is not one of {', '.join(SELECTIVE_POLICIES)}")


def selective_kept_bytes(
    cfg: ModelConfig,
    precision: str,
    *,
    tp: int = 1,
    sequence_parallel: bool = False,
    params_16bit: bool = False,
    policy: str = "every_matmul",
) -> float:
    """Per token, what op-level selective recomputation keeps of one block on one rank: its input
    (`checkpoint_input_bytes`) and the outputs of its matmuls and collectives (see the module
    docstring); everything else is recomputed in backward. `policy` (`SELECTIVE_POLICIES`):
    torchtitan's keeps every other matmul's output and the attention's instead."""
    a = activation_dtype_bytes(precision)
    h, f = cfg.hidden_size, cfg.ffn_hidden_size
    readers = 2 if cfg.mlp == "swiglu" else 1  # w1 (and w3) outputs kept
    block_input = checkpoint_input_bytes(cfg, tp=tp, sequence_parallel=sequence_parallel, precision=precision, params_16bit=params_16bit)
    reduced = 2 * a * h / (tp if sequence_parallel else 1) if tp > 1 else 0.0  # wo's and w2's collective outputs
    if policy == "torchtitan_op":
        if cfg.is_moe or cfg.is_mla or cfg.mlp != "swiglu":
            raise RecipeError("selective_policy", "torchtitan_op is counted for dense SwiGLU blocks with multi-head attention only")
        matmuls = a * ((h + cfg.kv_dim + f) / tp + h)  # wq, wv, w1 (column-split), w2 (full width, partial under tp)
        attention = a * h / tp + RESIDUAL_BYTES * cfg.num_heads / tp  # the flash kernel's output and logsumexp
        return block_input + matmuls + attention + (reduced if sequence_parallel else 0.0)  # only reduce-scatters are kept
    check_selective_policy(policy)
    attention = a * ((h + 2 * cfg.kv_dim) / tp + h)  # wq, wk, wv (column-split; k, v kv_dim wide), wo (full width, partial under tp)
    if cfg.is_mla:  # the matmuls' outputs: q_a (if any), q, kv_a (latent and rotary key), kv_b, o (no tp: refused)
        heads = cfg.num_heads
        attention = a * (
            cfg.q_lora_rank
            + heads * cfg.qk_head_dim
            + cfg.kv_lora_rank
            + cfg.qk_rope_head_dim
            + heads * (cfg.qk_nope_head_dim + cfg.v_head_dim)
            + h
        )
    dense = block_input + attention + a * (readers * f / tp + h) + reduced
    if not cfg.is_moe:
        return dense
    fe = cfg.expert_ffn
    routed = cfg.top_k * a * (readers * fe + h)  # each routed row's w1 (w3) and w2 outputs
    shared = a * (readers * cfg.num_shared_experts * fe + h) if cfg.num_shared_experts else 0.0
    moe = block_input + attention + a * cfg.num_experts + routed + shared + reduced
    return (dense * (cfg.num_layers - cfg.moe_layers) + moe * cfg.moe_layers) / cfg.num_layers
