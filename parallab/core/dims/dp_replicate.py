"""dp_replicate: full replicas whose gradients are averaged — DDP alone, HSDP's outer dim beside
dp_shard, a flat gradient all-reduce of the local shards beside tp or pp.

Alone it all-reduces every gradient in DDP's buckets; beside dp_shard, FSDP2's HSDP all-reduces
the reduce-scattered gradient shard (1/dp_shard of it) over the replicas; beside tp or pp, one
flat all-reduce of the rank's local gradients after backward. Its groups are the ranks of every
dimension inside it apart.
"""

from __future__ import annotations

from typing import ClassVar

from parallab.core.costs import GRAD_BYTES, chunk, numel
from parallab.core.dims.base import CommItem, Dimension, Plan
from parallab.core.layout import MeshAxisName


class DataReplicate(Dimension):
    name = MeshAxisName.DP_REPLICATE.value
    title = "replicas with a gradient all-reduce (DDP; HSDP's outer dim)"
    splits_batch: ClassVar[bool] = True

    def comm(self, plan: Plan) -> list[CommItem]:
        lay = plan.layout
        n = lay.dp_replicate
        if n == 1:
            return []
        stride = lay.inner("dp_replicate")
        shapes = plan.busiest_shapes("dp_shard")
        if lay.dp_shard > 1:  # HSDP: the reduce-scattered shard, per FSDP group and micro-step, overlapped like them
            micro_steps = plan.job.accum_steps
            nbytes = sum(numel(chunk(s, 0, lay.fsdp_shards)) for s in shapes) * GRAD_BYTES * micro_steps
            groups = lay.most_layers(plan.model.num_layers) + 1
            return [CommItem("all_reduce", nbytes, groups * micro_steps, n, stride, overlap=(groups - 1) / groups)]
        nbytes = sum(numel(s) for s in shapes) * GRAD_BYTES
        if lay.on == ("dp_replicate",):  # DDP's buckets, all but the last overlapped
            buckets = max(1, -(-nbytes // int(lay.bucket_cap_mb * 1024 * 1024)))
            return [CommItem("all_reduce", nbytes, buckets, n, stride, overlap=(buckets - 1) / buckets)]
        return [CommItem("all_reduce", nbytes, 1, n, stride)]


DIMENSION = DataReplicate()
