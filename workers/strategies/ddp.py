"""dp_replicate alone: DistributedDataParallel — full replicas, one bucketed gradient all-reduce
(the `ddp` preset, and any layout whose only dimension is dp_replicate; `compose` applies it).

Each rank takes its 1/dp of every micro-step (`compose.data_rank`); DDP averages gradients, so
the update equals the single-process one on the whole global batch. Non-final accumulation
micro-steps run under `no_sync` (`compose.accumulate`) so the all-reduce happens once per
optimizer step.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from workers.harness.runtime import RunContext


def wrap(model: nn.Module, ctx: RunContext, *, group: dist.ProcessGroup, bucket_cap_mb: float) -> DistributedDataParallel:
    """`model` placed on the rank's device, in DDP over `group`."""
    return DistributedDataParallel(
        model.to(ctx.device),
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        process_group=group,
        bucket_cap_mb=bucket_cap_mb,
        broadcast_buffers=False,  # the model has no buffers to keep in step
    )
