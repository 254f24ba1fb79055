"""The ep dimension (the `moe` preset, and every layout with ep; `compose` applies it): expert
parallelism — each rank owns num_experts/world experts; tokens travel by all-to-all.

Data is split over the ranks (the ep mesh dim doubles as data parallel). On each rank the MoE
layer routes its local tokens (`MoE.route`: softmax router, top-k, capacity per expert, drops
past capacity, Switch aux loss), then `ep_dispatch` sends every kept slot to the rank owning its
expert: per-expert counts are exchanged first (all_to_all_single on a count vector), then the
rows (an autograd-aware all-to-all: its backward is the reverse all-to-all), the owner runs its
experts, and a second all-to-all brings the results back to be combined with the gates.

Gradients: non-expert parameters are replicated and each rank's loss is over 1/world of the
batch, so their gradients are averaged (one flat all-reduce). An expert's gradient already sums
the contributions of every rank's loss (they arrived through the all-to-all backward), so it is
divided by world — both give the gradient of the global mean loss.

Equality with the single-process reference: capacity and the aux loss are per routing group, and
under EP a group is one rank's micro-batch. The reference (`build_model(route_groups=dp)`) routes
each micro-step's rows in dp equal groups, and `data.micro_batch` lays rows out so that group g is
exactly rank g's rows. The reference therefore keeps and drops the same slots, uses the same
capacities and averages the same aux losses; the loss is mean CE + coef × Σ_layers mean-group-aux
on both sides, equal up to float summation order.

`shard_experts` and `average_grads` are the ep step of `compose` (beside FSDP, which then shards
each rank's expert slice over dp_shard like any other tensor).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from workers.harness.model import ExpertLayer, Transformer
from workers.strategies.base import flat_all_reduce_, local_grad


class _AllToAll(torch.autograd.Function):
    """all_to_all_single whose backward sends the gradients back the way the rows came."""

    # `ctx` is autograd's per-call context: it carries what backward needs as plain attributes.
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: dist.ProcessGroup) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: dist.ProcessGroup) -> torch.Tensor:
    out: torch.Tensor = _AllToAll.apply(x, out_splits, in_splits, group)
    return out


def ep_dispatch(moe: ExpertLayer, xs: torch.Tensor, expert_ids: torch.Tensor, *, group: dist.ProcessGroup) -> torch.Tensor:
    """Run each routed row on its expert's rank; rows come back in the order they were given."""
    world, local = dist.get_world_size(group), moe.num_local_experts
    order = torch.argsort(expert_ids, stable=True)  # by expert, hence by owner rank
    counts = torch.bincount(expert_ids, minlength=moe.num_experts)
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)  # [source rank][my local expert]
    recv_counts = recv_counts.view(world, local)
    send_splits = counts.view(world, local).sum(1).tolist()
    recv_splits = recv_counts.sum(1).tolist()
    received = all_to_all(xs[order], recv_splits, send_splits, group)
    # Received rows are ordered by source, then local expert: regroup by local expert.
    local_ids = torch.arange(local, device=xs.device).repeat(world).repeat_interleave(recv_counts.flatten())
    regroup = torch.argsort(local_ids, stable=True)
    out = moe.run_experts(received[regroup], recv_counts.sum(0).tolist())[torch.argsort(regroup)]
    returned = all_to_all(out, send_splits, recv_splits, group)
    return returned[torch.argsort(order)]


def shard_experts(model: nn.Module, group: dist.ProcessGroup) -> nn.Module:
    """Keep this rank's contiguous slice of every MoE layer's experts (a workload model's
    `expert_layers`, any family's; else the expert layers the module holds); route through
    all-to-all."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    layers = model.expert_layers() if isinstance(model, Transformer) else [m for m in model.modules() if isinstance(m, ExpertLayer)]
    for moe in layers:
        local = moe.num_experts // world
        lo = rank * local
        for name, weight in moe.experts().items():
            setattr(moe, name, nn.Parameter(weight.data[lo : lo + local].clone()))
        moe.expert_offset, moe.num_local_experts = lo, local
        moe.dispatch = functools.partial(ep_dispatch, group=group)
    return model


def _is_expert(model: nn.Module) -> dict[int, bool]:
    experts = {id(w) for m in model.modules() if isinstance(m, ExpertLayer) for w in m.experts().values()}
    return {id(p): id(p) in experts for p in model.parameters()}


def average_grads(model: nn.Module, ep: DeviceMesh) -> None:
    """The gradient of the global mean loss over the ep ranks (module docstring): the non-expert
    gradients averaged in one flat all-reduce, the expert gradients (already summed over the ranks
    by the all-to-all's backward) divided by n. Under FSDP both are the rank's local shards."""
    n = ep.size()
    expert = _is_expert(model)
    grads = [(local_grad(p.grad), expert[id(p)]) for p in model.parameters() if p.grad is not None]
    flat_all_reduce_([g for g, is_expert in grads if not is_expert], ep.get_group(), scale=1.0 / n)
    for g, is_expert in grads:
        if is_expert:
            g.div_(n)
