"""`fsdp`: FSDP2 `fully_shard` per block and the root — ZeRO-3 (ZeRO-2 without resharding).

Model state at rest (between steps, where it is measured) is a dim-0 shard of every parameter,
gradient and optimizer state (`torch.chunk` semantics: rank 0 holds ceil(d0/N) rows), with
`reshard_after_forward` true *and* false: false only keeps the gathered parameters alive between
a block's forward and its backward (ZeRO-2's communication, a higher peak), it does not change
the resting state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from parallab.core.costs import chunk, gathered_param_bytes, model_tensors, numel
from parallab.core.dims.dp_shard import fsdp_comm, fsdp_items
from parallab.core.layout import Layout
from parallab.core.strategies.base import ActivationLayout, CommItem, StrategyDescriptor, StrategyOptions

if TYPE_CHECKING:
    from parallab.core.jobs import ResolvedJob


class FSDPOptions(StrategyOptions):
    reshard_after_forward: bool = Field(True, description="True ≈ ZeRO-3; False keeps gathered params until backward (≈ ZeRO-2).")


class FSDP(StrategyDescriptor[FSDPOptions]):
    name = "fsdp"
    title = "ZeRO-3 style sharding with FSDP2"
    options_model = FSDPOptions
    plan_options = ({"reshard_after_forward": True}, {"reshard_after_forward": False})

    def layout(self, world_size: int, options: FSDPOptions) -> Layout:
        return Layout(dp_shard=world_size, reshard_after_forward=options.reshard_after_forward)

    def param_elements_per_rank(self, job: ResolvedJob) -> list[int]:
        return [sum(numel(chunk(t.shape, 0, job.world_size)) for t in model_tensors(job.model))]

    def comm_bytes_per_step(self, job: ResolvedJob) -> dict[str, int]:
        return fsdp_comm(
            model_tensors(job.model),
            job.world_size,
            reshard_after_forward=self.opts(job).reshard_after_forward,
            param_bytes=gathered_param_bytes(job.workload.precision),
            micro_steps=job.accum_steps,
        )

    def activation_layout(self, job: ResolvedJob) -> ActivationLayout:
        """The default layout, without autocast's weight copies: FSDP gathers 16-bit weights (its param_dtype)."""
        tokens = job.micro_batch_size * job.model.seq_len
        return ActivationLayout(tokens=tokens, layers=job.model.num_layers, head_tokens=tokens, weight_copies=False)

    def comm_items(self, job: ResolvedJob) -> list[CommItem]:
        reshard = self.opts(job).reshard_after_forward
        comm = self.comm_bytes_per_step(job)
        return fsdp_items(
            comm, groups=job.model.num_layers + 1, reshard_after_forward=reshard, n=job.world_size, micro_steps=job.accum_steps
        )


DESCRIPTOR = FSDP()
