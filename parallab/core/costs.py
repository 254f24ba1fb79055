"""Byte sizes per parameter and per element, and how a tensor splits, as every strategy's cost
formulas need them.

The tensors themselves are the model family's (`parallab.core.families`: `model_tensors` lists
every parameter the harness builds, with the dim tensor parallelism shards, and is re-exported
here); the strategies' formulas count what a rank holds and sends from it, tensor by tensor, so a
measured run can be held against them exactly.
"""

from __future__ import annotations

import math

from parallab.core.families import Tensor as Tensor
from parallab.core.families import model_tensors as model_tensors

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
    """Bytes per activation element under the precision's autocast. fp8 runs bf16 autocast: torchao's
    Float8Linear casts each linear's input and weight to fp8 for its GEMM only, and the tensors
    between ops (what autograd keeps, what TP and EP send) stay bf16."""
    return {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 2}.get(precision, 4)


def gathered_param_bytes(precision: str) -> int:
    """Bytes per element of FSDP's parameter all-gather (its param_dtype; fp8: torchao's float8
    all-gather of the Float8Linear weights, which are nearly all of them)."""
    return {"bf16": 2, "fp16": 2, "fp8": 1}.get(precision, 4)


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


A2A_CALLS = 5
"""Expert parallelism's all-to-alls per MoE layer and micro-step: the counts (forward only, no
gradient), rows out and back forward, the reverse of both backward (measured on gloo: 20 a step
on a 4-layer `tiny` with experts)."""


def chunk(shape: tuple[int, ...], dim: int, n: int) -> tuple[int, ...]:
    """Rank 0's piece of `shape` split n ways along `dim` (torch.chunk: ceil)."""
    return tuple(math.ceil(d / n) if i == dim else d for i, d in enumerate(shape))


def tp_local(t: Tensor, tp: int) -> tuple[int, ...]:
    """The shape one tensor-parallel rank holds of `t`."""
    return chunk(t.shape, t.tp_dim, tp) if t.tp_dim is not None and tp > 1 else t.shape


def fsdp_padded(shape: tuple[int, ...], n: int) -> int:
    """Elements FSDP2's all-gather / reduce-scatter buffer holds for one param (dim 0 padded to N)."""
    return math.ceil(shape[0] / n) * n * numel(shape[1:])
