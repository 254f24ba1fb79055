"""`fsdp`: FSDP2 `fully_shard` per transformer block, then the root (embedding, final norm, head).

Blocks are the units of all-gather/reduce-scatter so that only one block's full parameters are
live at a time; the root group holds the rest. `reshard_after_forward=True` frees each block's
gathered parameters after its forward (ZeRO-3), False keeps them for backward (≈ ZeRO-2).
Mixed precision (bf16 params in compute, fp32 reduction) only on CUDA — on CPU autocast in the
loop does the casting and FSDP keeps fp32.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from parallab.core.strategies.fsdp import FSDPOptions
from workers.harness.model import Transformer
from workers.harness.runtime import RunContext
from workers.strategies.base import Applied, Strategy


def mixed_precision(ctx: RunContext) -> MixedPrecisionPolicy:
    if ctx.device.type == "cuda" and ctx.precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard(model: Transformer, mesh: DeviceMesh, *, reshard_after_forward: bool, mp_policy: MixedPrecisionPolicy) -> Transformer:
    """Shard every block, then the root (the option is passed to the root too, explicitly)."""
    for block in model.layers.values():
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy)
    return model


class FSDP(Strategy[FSDPOptions, Applied]):
    name = "fsdp"

    def apply(self, model: Transformer, ctx: RunContext, options: FSDPOptions) -> Applied:
        model = model.to(ctx.device)
        return Applied(
            shard(model, ctx.mesh_dim("dp"), reshard_after_forward=options.reshard_after_forward, mp_policy=mixed_precision(ctx))
        )


STRATEGY = FSDP()
