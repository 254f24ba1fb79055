"""`ddp`: data parallel with DistributedDataParallel — full replicas, one bucketed gradient all-reduce.

Each rank takes its 1/dp of every micro-step (default `local_batch`); DDP averages gradients, so
the update equals the single-process one on the whole global batch. Non-final accumulation
micro-steps run under `no_sync` so the all-reduce happens once per optimizer step.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from parallab.core.strategies.ddp import DDPOptions
from workers.harness.model import Transformer
from workers.harness.runtime import RunContext
from workers.strategies.base import Applied, Strategy


@dataclass(frozen=True)
class DDPApplied(Applied):
    model: DistributedDataParallel


def wrap(model: nn.Module, ctx: RunContext, *, group: dist.ProcessGroup, bucket_cap_mb: float) -> DistributedDataParallel:
    """`model` placed on the rank's device, in DDP over `group`."""
    return DistributedDataParallel(
        model.to(ctx.device),
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        process_group=group,
        bucket_cap_mb=bucket_cap_mb,
        broadcast_buffers=False,  # the model has no buffers to keep in step
    )


class DDP(Strategy[DDPOptions, DDPApplied]):
    name = "ddp"

    def apply(self, model: Transformer, ctx: RunContext, options: DDPOptions) -> DDPApplied:
        return DDPApplied(wrap(model, ctx, group=ctx.mesh_dim("dp").get_group(), bucket_cap_mb=options.bucket_cap_mb))

    def accumulate(self, applied: DDPApplied, last: bool) -> AbstractContextManager[object]:
        return contextlib.nullcontext() if last else applied.model.no_sync()


STRATEGY = DDP()
