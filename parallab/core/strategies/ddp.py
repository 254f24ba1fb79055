"""`ddp`: data parallel — full replicas, one bucketed gradient all-reduce per step (every rank on
dp_replicate; its costs are that dimension's, `parallab.core.dims.dp_replicate`)."""

from __future__ import annotations

from pydantic import Field

from parallab.core.layout import MeshAxisName
from parallab.core.strategies.layout import LayoutDescriptor, OneAxisOptions


class DDPOptions(OneAxisOptions):
    axis = MeshAxisName.DP_REPLICATE

    bucket_cap_mb: float = Field(
        25.0,
        gt=0,
        le=4096,
        description="Gradient bucket size of DistributedDataParallel, in MiB (PyTorch counts 1 MB as 1024 × 1024 bytes).",
    )


class DDP(LayoutDescriptor[DDPOptions]):
    name = "ddp"
    title = "data parallel, gradient all-reduce"
    options_model = DDPOptions
    plan_options = ({},)


DESCRIPTOR = DDP()
