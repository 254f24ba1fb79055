"""dp_shard: FSDP2 `fully_shard` per block and the root over this dim (HSDP's inner dim when
dp_replicate is on too).

At rest a rank keeps a dim-0 chunk of what the dimensions before it left (the TP-local shard of
its stage's tensors). Per step it all-gathers every group forward (and again backward when it
reshards after forward) and reduce-scatters every gradient (`fsdp_comm`, on the stage's
tensors), once per accumulation micro-step. Its groups are `cp × tp` ranks apart on the mesh.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import ClassVar

from parallab.core.costs import GRAD_BYTES, Tensor, chunk, fsdp_padded, gathered_param_bytes
from parallab.core.dims.base import ActivationLayout, CommItem, Dimension, Plan
from parallab.core.layout import Layout, MeshAxisName


def fsdp_comm(
    tensors: list[Tensor],
    n: int,
    *,
    reshard_after_forward: bool,
    param_bytes: int,
    micro_steps: int,
    local: Callable[[Tensor], tuple[int, ...]] = lambda t: t.shape,
) -> dict[str, int]:
    """FSDP2 per step: all-gather every group (blocks and root) forward, and again in backward when
    they reshard after forward — the root too, since the harness passes the option explicitly
    (FSDP2's "root never reshards" heuristic applies only to the default); reduce-scatter every
    gradient (fp32). All of it once per accumulation micro-step: FSDP2 reduces every backward
    unless told not to, and the harness keeps no unsharded gradients between micro-steps (the
    memory ZeRO-3 is for). Buffers are dim-0 padded to a multiple of N; `local` is the shape the
    sharded rank group holds before FSDP (hybrid: the TP-local shape)."""
    total = sum(fsdp_padded(local(t), n) for t in tensors) * micro_steps
    return {"all_gather": total * param_bytes * (2 if reshard_after_forward else 1), "reduce_scatter": total * GRAD_BYTES}


def fsdp_items(
    comm: dict[str, int], *, groups: int, reshard_after_forward: bool, n: int, micro_steps: int, stride: int = 1
) -> list[CommItem]:
    """FSDP2's calls, per accumulation micro-step: one all-gather per group (blocks and root)
    forward, again in backward when resharding, one reduce-scatter per group; each group's is
    prefetched or issued while another group computes, so all but one group's hide under compute."""
    hidden = (groups - 1) / groups
    gathers = groups * (2 if reshard_after_forward else 1) * micro_steps
    return [
        CommItem("all_gather", comm["all_gather"], gathers, n, stride, overlap=hidden),
        CommItem("reduce_scatter", comm["reduce_scatter"], groups * micro_steps, n, stride, overlap=hidden),
    ]


class DataShard(Dimension):
    name = MeshAxisName.DP_SHARD.value
    title = "FSDP2 sharding of parameters, gradients and optimizer state"
    splits_batch: ClassVar[bool] = True

    def local_shape(self, t: Tensor, shape: tuple[int, ...], layout: Layout) -> tuple[int, ...]:
        return chunk(shape, 0, layout.fsdp_shards)

    def comm(self, plan: Plan) -> list[CommItem]:
        lay = plan.layout
        n = lay.fsdp_shards
        if n == 1:
            return []
        shapes = plan.busiest_shapes("dp_shard")
        comm = fsdp_comm(
            [Tensor("", s, None, None) for s in shapes],
            n,
            reshard_after_forward=lay.reshard_after_forward,
            param_bytes=gathered_param_bytes(plan.precision),
            micro_steps=plan.job.accum_steps,
        )
        groups = lay.most_layers(plan.model.num_layers) + 1
        items = fsdp_items(
            comm,
            groups=groups,
            reshard_after_forward=lay.reshard_after_forward,
            n=n,
            micro_steps=plan.job.accum_steps,
            # the flattened dp_shard × cp group's members are cp's inner degrees apart
            stride=lay.inner("cp" if lay.shard_over_cp and lay.cp > 1 else "dp_shard"),
        )
        if lay.pp == 1 or not lay.reshard_after_forward:
            return items
        # Under a pipeline schedule, FSDP2 keeps the gathered parameters through backward until the
        # stage's last micro-batch (the stage turns reshard-after-backward off), but a stage that
        # reshards after forward gathers again for each micro-batch's forward: m forward passes
        # and one backward pass of all-gathers per schedule step (measured on gloo, torch 2.13), one
        # schedule step per accumulation micro-step.
        passes = lay.microbatches + 1
        calls = groups * passes * plan.job.accum_steps
        return [replace(i, bytes_per_step=i.bytes_per_step // 2 * passes, calls=calls) if i.op == "all_gather" else i for i in items]

    def activations(self, plan: Plan, layouts: list[ActivationLayout]) -> list[ActivationLayout]:
        """FSDP gathers 16-bit weights (its param_dtype): no autocast copies of the block weights."""
        if plan.layout.fsdp_shards == 1:
            return layouts
        return [replace(a, weight_copies=False) for a in layouts]


DIMENSION = DataShard()
