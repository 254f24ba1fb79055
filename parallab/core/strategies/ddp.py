"""`ddp`: data parallel — full replicas, one bucketed gradient all-reduce per step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from parallab.core.costs import GRAD_BYTES
from parallab.core.model import param_counts
from parallab.core.strategies.base import StrategyDescriptor, StrategyOptions

if TYPE_CHECKING:
    from parallab.core.jobs import ResolvedJob


class DDPOptions(StrategyOptions):
    bucket_cap_mb: float = Field(25.0, gt=0, le=4096, description="Gradient bucket size of DistributedDataParallel (MB).")


class DDP(StrategyDescriptor[DDPOptions]):
    name = "ddp"
    title = "data parallel, gradient all-reduce"
    options_model = DDPOptions

    def comm_bytes_per_step(self, job: ResolvedJob) -> dict[str, int]:
        """One all-reduce of every (fp32) gradient: Ψ·4 bytes, however it is bucketed."""
        return {"all_reduce": param_counts(job.model).total * GRAD_BYTES}


DESCRIPTOR = DDP()
