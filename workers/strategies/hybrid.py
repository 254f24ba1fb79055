"""`hybrid`: a 2-D mesh ("dp", "tp") — tensor parallel inside each dp group, then FSDP over dp.

The fixed composition order (torchtitan's): TP first, so FSDP shards the TP-local DTensors over
the "dp" dim (2-D parameters: Shard on dp × the TP placement). Data is split over dp only; the
tp ranks of a dp group see the same rows (default `local_batch` reads the "dp" coordinate).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from workers.strategies import fsdp, tensor_parallel


def apply(model: nn.Module, ctx: Any, options: dict[str, Any]) -> nn.Module:
    model = model.to(ctx.device)
    tensor_parallel.parallelize(model, ctx.mesh["tp"], sequence_parallel=options["sequence_parallel"])
    return fsdp.shard(model, ctx.mesh["dp"], reshard_after_forward=options["reshard_after_forward"], mp_policy=fsdp.mixed_precision(ctx))
