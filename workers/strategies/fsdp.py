"""dp_shard: FSDP2 `fully_shard` per transformer block, then the root (embedding, final norm, head) —
the `fsdp` preset, HSDP beside dp_replicate, and every layout with dp_shard (`compose` applies it).

Blocks are the units of all-gather/reduce-scatter so that only one block's full parameters are
live at a time; the root group holds the rest. `reshard_after_forward=True` frees each block's
gathered parameters after its forward (ZeRO-3), False keeps them for backward (≈ ZeRO-2).
Mixed precision on every device (CPU/gloo included): under bf16 and fp16 FSDP all-gathers 16-bit
parameters for compute (`param_dtype`) and reduce-scatters gradients in fp32 (`reduce_dtype`),
while the sharded parameters, their gradients and AdamW's state stay fp32 — what the prediction
counts (`parallab.core.costs.gathered_param_bytes`: 2-byte gathers, 4-byte reduce-scatters).
fp8 gathers bf16 too, except torchao's Float8Linear weights, which it all-gathers in fp8.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from workers.harness.model import Transformer

PARAM_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}
"""FSDP's compute (all-gather) dtype of each precision; fp32 keeps the parameters' own dtype."""


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    """16-bit gathered parameters and fp32 gradient reduction for the 16-bit precisions, on any device."""
    dtype = PARAM_DTYPES.get(precision)
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def shard(model: Transformer, mesh: DeviceMesh, *, reshard_after_forward: bool, mp_policy: MixedPrecisionPolicy) -> Transformer:
    """Shard every block, then the root (the option is passed to the root too, explicitly)."""
    for block in model.blocks():
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy)
    return model
