"""`ddp`: data parallel — full replicas, one bucketed gradient all-reduce per step."""

from __future__ import annotations

from pydantic import Field

from parallab.core.layout import Layout
from parallab.core.strategies.base import StrategyOptions
from parallab.core.strategies.composed import ComposedCosts


class DDPOptions(StrategyOptions):
    bucket_cap_mb: float = Field(
        25.0,
        gt=0,
        le=4096,
        description="Gradient bucket size of DistributedDataParallel, in MiB (PyTorch counts 1 MB as 1024 × 1024 bytes).",
    )


class DDP(ComposedCosts[DDPOptions]):
    name = "ddp"
    title = "data parallel, gradient all-reduce"
    options_model = DDPOptions
    plan_options = ({},)

    def layout(self, world_size: int, options: DDPOptions) -> Layout:
        return Layout(dp_replicate=world_size, bucket_cap_mb=options.bucket_cap_mb)


DESCRIPTOR = DDP()
