"""`fsdp`: FSDP2 `fully_shard` per transformer block, then the root (embedding, final norm, head).

Blocks are the units of all-gather/reduce-scatter so that only one block's full parameters are
live at a time; the root group holds the rest. `reshard_after_forward=True` frees each block's
gathered parameters after its forward (ZeRO-3), False keeps them for backward (≈ ZeRO-2).
Mixed precision (bf16 params in compute, fp32 reduction) only on CUDA — on CPU autocast in the
loop does the casting and FSDP keeps fp32.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def mixed_precision(ctx: Any) -> MixedPrecisionPolicy:
    if ctx.device.type == "cuda" and ctx.precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard(model: nn.Module, mesh: DeviceMesh, *, reshard_after_forward: bool, mp_policy: MixedPrecisionPolicy) -> nn.Module:
    """Shard every block, then the root; the root never reshards (its params are needed first in backward)."""
    for block in model.layers.values():
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy)
    return model


def apply(model: nn.Module, ctx: Any, options: dict[str, Any]) -> nn.Module:
    model = model.to(ctx.device)
    return shard(model, ctx.mesh["dp"] if ctx.mesh.ndim > 1 else ctx.mesh, reshard_after_forward=options["reshard_after_forward"], mp_policy=mixed_precision(ctx))
