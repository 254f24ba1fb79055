"""The model's tensors and byte sizes, as the cost formulas of every strategy need them.

`model_tensors` lists every parameter the harness builds (workers.harness.model), with the dim
tensor parallelism shards; the strategies' formulas count what a rank holds and sends from it,
tensor by tensor, so a measured run can be held against them exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from parallab.core.model import ModelConfig

FP32_ADAM = (4, 4, 8)
"""Bytes per parameter of (params, grads, optimizer state) for fp32 AdamW: fp32 weights and
gradients, fp32 momentum and variance."""
MIXED_ADAM = (2, 2, 12)
"""The ZeRO paper's mixed-precision recipe (Rajbhandari et al. 2020, §3.1): fp16 params and grads,
and K = 12 bytes of optimizer state (fp32 master copy, momentum and variance). parallab does not
run this recipe; it is kept for the paper's table (`zero_stages_bytes_per_rank`)."""
GRAD_BYTES = 4
"""Gradients travel in fp32: autocast keeps fp32 parameters, so their gradients are fp32."""

PRECISION_RECIPES = {
    "fp32": "fp32 AdamW: fp32 params, grads, momentum and variance (4+4+8 bytes per parameter)",
    "autocast": "autocast {dtype} compute with fp32 master weights: fp32 params and grads, fp32 AdamW momentum "
    "and variance (4+4+8 bytes per parameter); matmul activations in {dtype}",
    "zero": "the ZeRO paper's mixed-precision Adam: 16-bit params and grads, fp32 master copy, momentum and "
    "variance (2+2+12 bytes per parameter)",
}
"""What each model-state formula assumes, as the prediction labels it (`precision_recipe`)."""


def state_bytes_per_param(precision: str) -> tuple[int, int, int]:
    """(params, grads, optimizer) bytes per parameter of what the harness runs: 4+4+8 in every precision.

    bf16/fp16 run under torch autocast, which keeps the fp32 parameters (the master weights), so
    their gradients and AdamW's momentum and variance are fp32 as well; only activations shrink.
    """
    return FP32_ADAM


def precision_recipe(precision: str) -> str:
    """The recipe `state_bytes_per_param(precision)` describes, in words."""
    if precision == "fp32":
        return PRECISION_RECIPES["fp32"]
    return PRECISION_RECIPES["autocast"].format(dtype=precision)


def zero_paper_bytes_per_param(precision: str) -> tuple[int, int, int]:
    """(params, grads, optimizer) bytes per parameter in the ZeRO paper's table: its mixed-precision
    recipe (2+2+12) for 16-bit training, fp32 Adam (4+4+8) otherwise."""
    return FP32_ADAM if precision == "fp32" else MIXED_ADAM


def zero_paper_recipe(precision: str) -> str:
    """The recipe `zero_paper_bytes_per_param(precision)` describes, in words."""
    return PRECISION_RECIPES["fp32"] if precision == "fp32" else PRECISION_RECIPES["zero"]


def activation_dtype_bytes(precision: str) -> int:
    """Bytes per activation element under the precision's autocast."""
    return {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}.get(precision, 4)


def gathered_param_bytes(precision: str) -> int:
    """Bytes per element of FSDP's parameter all-gather (its param_dtype; fp8: torchao's float8
    all-gather of the Float8Linear weights, which are nearly all of them)."""
    return {"bf16": 2, "fp16": 2, "fp8": 1}.get(precision, 4)


@dataclass(frozen=True)
class Tensor:
    """One parameter of the workload model."""

    name: str
    shape: tuple[int, ...]
    layer: int | None
    """None: embedding, final norm or head (FSDP's root group)."""
    tp_dim: int | None
    """The dim tensor parallelism shards (None: replicated)."""
    expert: bool = False


def model_tensors(cfg: ModelConfig) -> list[Tensor]:
    """Every parameter of the workload model with the dim TP shards (nn.Linear weight is (out, in))."""
    h, f, v = cfg.hidden_size, cfg.ffn_hidden_size, cfg.vocab_size
    out = [Tensor("tok_embeddings.weight", (v, h), None, 0)]
    for i in range(cfg.num_layers):
        out += [Tensor(f"layers.{i}.attention_norm.weight", (h,), i, None), Tensor(f"layers.{i}.ffn_norm.weight", (h,), i, None)]
        out += [Tensor(f"layers.{i}.attention.w{x}.weight", (h, h), i, 0) for x in "qkv"]
        out += [Tensor(f"layers.{i}.attention.wo.weight", (h, h), i, 1)]
        if cfg.is_moe:
            e = cfg.num_experts
            out += [Tensor(f"layers.{i}.feed_forward.router.weight", (e, h), i, None)]
            out += [
                Tensor(f"layers.{i}.feed_forward.{w}", s, i, None, expert=True)
                for w, s in (("w1", (e, h, f)), ("w3", (e, h, f)), ("w2", (e, f, h)))
            ]
        else:
            out += [
                Tensor(f"layers.{i}.feed_forward.w1.weight", (f, h), i, 0),
                Tensor(f"layers.{i}.feed_forward.w3.weight", (f, h), i, 0),
                Tensor(f"layers.{i}.feed_forward.w2.weight", (h, f), i, 1),
            ]
    out += [Tensor("norm.weight", (h,), None, None), Tensor("output.weight", (v, h), None, 0)]
    return out


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def chunk(shape: tuple[int, ...], dim: int, n: int) -> tuple[int, ...]:
    """Rank 0's piece of `shape` split n ways along `dim` (torch.chunk: ceil)."""
    return tuple(math.ceil(d / n) if i == dim else d for i, d in enumerate(shape))


def tp_local(t: Tensor, tp: int) -> tuple[int, ...]:
    """The shape one tensor-parallel rank holds of `t`."""
    return chunk(t.shape, t.tp_dim, tp) if t.tp_dim is not None and tp > 1 else t.shape


def fsdp_padded(shape: tuple[int, ...], n: int) -> int:
    """Elements FSDP2's all-gather / reduce-scatter buffer holds for one param (dim 0 padded to N)."""
    return math.ceil(shape[0] / n) * n * numel(shape[1:])
