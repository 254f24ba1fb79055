"""`fsdp`: FSDP2 `fully_shard` per block and the root — ZeRO-3 (ZeRO-2 without resharding).

Model state at rest (between steps, where it is measured) is a dim-0 shard of every parameter,
gradient and optimizer state (`torch.chunk` semantics: rank 0 holds ceil(d0/N) rows), with
`reshard_after_forward` true *and* false: false only keeps the gathered parameters alive between
a block's forward and its backward (ZeRO-2's communication, a higher peak), it does not change
the resting state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import Field

from parallab.core.costs import GRAD_BYTES, Tensor, chunk, fsdp_padded, gathered_param_bytes, model_tensors, numel
from parallab.core.strategies.base import ActivationLayout, CommItem, StrategyDescriptor, StrategyOptions

if TYPE_CHECKING:
    from parallab.core.jobs import ResolvedJob


class FSDPOptions(StrategyOptions):
    reshard_after_forward: bool = Field(True, description="True ≈ ZeRO-3; False keeps gathered params until backward (≈ ZeRO-2).")


def fsdp_comm(
    tensors: list[Tensor],
    n: int,
    *,
    reshard_after_forward: bool,
    param_bytes: int,
    local: Callable[[Tensor], tuple[int, ...]] = lambda t: t.shape,
) -> dict[str, int]:
    """FSDP2 per step: all-gather every group (blocks and root) forward, and again in backward when
    they reshard after forward — the root too, since the harness passes the option explicitly
    (FSDP2's "root never reshards" heuristic applies only to the default); reduce-scatter every
    gradient (fp32). Buffers are dim-0 padded to a multiple of N; `local` is the shape the
    sharded rank group holds before FSDP (hybrid: the TP-local shape)."""
    total = sum(fsdp_padded(local(t), n) for t in tensors)
    return {"all_gather": total * param_bytes * (2 if reshard_after_forward else 1), "reduce_scatter": total * GRAD_BYTES}


def fsdp_items(comm: dict[str, int], *, groups: int, reshard_after_forward: bool, n: int, stride: int = 1) -> list[CommItem]:
    """FSDP2's calls: one all-gather per group (blocks and root) forward, again in backward when
    resharding, one reduce-scatter per group; each group's is prefetched or issued while another
    group computes, so all but one group's hide under compute."""
    hidden = (groups - 1) / groups
    gathers = groups * (2 if reshard_after_forward else 1)
    return [
        CommItem("all_gather", comm["all_gather"], gathers, n, stride, overlap=hidden),
        CommItem("reduce_scatter", comm["reduce_scatter"], groups, n, stride, overlap=hidden),
    ]


class FSDP(StrategyDescriptor[FSDPOptions]):
    name = "fsdp"
    title = "ZeRO-3 style sharding with FSDP2"
    options_model = FSDPOptions

    def param_elements_per_rank(self, job: ResolvedJob) -> list[int]:
        return [sum(numel(chunk(t.shape, 0, job.world_size)) for t in model_tensors(job.model))]

    def comm_bytes_per_step(self, job: ResolvedJob) -> dict[str, int]:
        return fsdp_comm(
            model_tensors(job.model),
            job.world_size,
            reshard_after_forward=self.opts(job).reshard_after_forward,
            param_bytes=gathered_param_bytes(job.workload.precision),
        )

    def activation_layout(self, job: ResolvedJob) -> ActivationLayout:
        """The default layout, without autocast's weight copies: FSDP gathers 16-bit weights (its param_dtype)."""
        tokens = job.micro_batch_size * job.model.seq_len
        return ActivationLayout(tokens=tokens, layers=job.model.num_layers, head_tokens=tokens, weight_copies=False)

    def comm_items(self, job: ResolvedJob) -> list[CommItem]:
        reshard = self.opts(job).reshard_after_forward
        comm = self.comm_bytes_per_step(job)
        return fsdp_items(comm, groups=job.model.num_layers + 1, reshard_after_forward=reshard, n=job.world_size)


DESCRIPTOR = FSDP()
