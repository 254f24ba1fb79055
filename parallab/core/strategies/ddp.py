"""`ddp`: data parallel — full replicas, one bucketed gradient all-reduce per step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from parallab.core.costs import GRAD_BYTES
from parallab.core.families import param_counts
from parallab.core.layout import Layout
from parallab.core.strategies.base import CommItem, StrategyDescriptor, StrategyOptions

if TYPE_CHECKING:
    from parallab.core.jobs import ResolvedJob


class DDPOptions(StrategyOptions):
    bucket_cap_mb: float = Field(
        25.0,
        gt=0,
        le=4096,
        description="Gradient bucket size of DistributedDataParallel, in MiB (PyTorch counts 1 MB as 1024 × 1024 bytes).",
    )


class DDP(StrategyDescriptor[DDPOptions]):
    name = "ddp"
    title = "data parallel, gradient all-reduce"
    options_model = DDPOptions
    plan_options = ({},)

    def layout(self, world_size: int, options: DDPOptions) -> Layout:
        return Layout(dp_replicate=world_size, bucket_cap_mb=options.bucket_cap_mb)

    def comm_bytes_per_step(self, job: ResolvedJob) -> dict[str, int]:
        """One all-reduce of every (fp32) gradient: Ψ·4 bytes, however it is bucketed."""
        return {"all_reduce": param_counts(job.model).total * GRAD_BYTES}

    def comm_items(self, job: ResolvedJob) -> list[CommItem]:
        """One all-reduce per gradient bucket; every bucket but the last overlaps the rest of backward."""
        nbytes = self.comm_bytes_per_step(job)["all_reduce"]
        buckets = max(1, -(-nbytes // int(self.opts(job).bucket_cap_mb * 1024 * 1024)))
        return [CommItem("all_reduce", nbytes, buckets, job.world_size, overlap=(buckets - 1) / buckets)]


DESCRIPTOR = DDP()
