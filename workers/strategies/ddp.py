"""`ddp`: data parallel with DistributedDataParallel — full replicas, one bucketed gradient all-reduce.

Each rank takes its 1/dp of every micro-step (default `local_batch`); DDP averages gradients, so
the update equals the single-process one on the whole global batch. Non-final accumulation
micro-steps run under `no_sync` so the all-reduce happens once per optimizer step.
"""

from __future__ import annotations

import contextlib
from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel


def apply(model: nn.Module, ctx: Any, options: dict[str, Any]) -> nn.Module:
    model = model.to(ctx.device)
    return DistributedDataParallel(
        model,
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        process_group=ctx.mesh.get_group("dp"),
        bucket_cap_mb=options["bucket_cap_mb"],
        broadcast_buffers=False,  # the model has no buffers to keep in step
    )


def accumulate(model: nn.Module, last: bool) -> Any:
    return contextlib.nullcontext() if last else model.no_sync()
