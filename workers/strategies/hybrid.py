"""`hybrid`: a 2-D mesh ("dp", "tp") — tensor parallel inside each dp group, then FSDP over dp.

The fixed composition order (torchtitan's): TP first, so FSDP shards the TP-local DTensors over
the "dp" dim (2-D parameters: Shard on dp × the TP placement). Data is split over dp only; the
tp ranks of a dp group see the same rows (the default `local_batch` reads the "dp" coordinate).
"""

from __future__ import annotations

from parallab.core.strategies.hybrid import HybridOptions
from workers.harness.model import Transformer
from workers.harness.runtime import RunContext
from workers.strategies import fsdp, tensor_parallel
from workers.strategies.base import Applied, Strategy


class Hybrid(Strategy[HybridOptions, Applied]):
    name = "hybrid"

    def apply(self, model: Transformer, ctx: RunContext, options: HybridOptions) -> Applied:
        model = model.to(ctx.device)
        tensor_parallel.parallelize(model, ctx.mesh_dim("tp"), sequence_parallel=options.sequence_parallel)
        sharded = fsdp.shard(
            model, ctx.mesh_dim("dp"), reshard_after_forward=options.reshard_after_forward, mp_policy=fsdp.mixed_precision(ctx.precision)
        )
        return Applied(sharded)


STRATEGY = Hybrid()
