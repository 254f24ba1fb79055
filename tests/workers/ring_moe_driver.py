"""torchrun script (not a test module): ring attention and expert-parallel MoE against one-rank math.

Launched by test_ring_attention.py / test_moe.py at 4 ranks; every case runs on the whole world
(ring or EP size 4) and on two 2-rank subgroups ([0, 1] and [2, 3], size 2). Every rank holds the
same full tensors (same seed), computes the reference on them locally, runs the distributed
version on its slice, and the max errors (MAX over ranks) go to --out as JSON from rank 0.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from parallab.core.model import PRESETS, ModelConfig
from tests.workers.driver_context import finish, start
from workers.harness.data import sequence_positions
from workers.harness.model import MoE
from workers.strategies.expert_parallel import shard_experts
from workers.strategies.ring_attention import ring_attention


def _max(err: float) -> float:
    t = torch.tensor([err], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def ring_case(group, causal: bool, zigzag: bool) -> dict[str, float]:
    n, r = dist.get_world_size(group), dist.get_rank(group)
    g = torch.Generator().manual_seed(1)
    b, h, s, d = 2, 3, 32, 8
    q, k, v, do = (torch.randn(b, h, s, d, generator=g) for _ in range(4))
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*full, is_causal=causal)
    ref.backward(do)
    positions = [sequence_positions(s, ring_size=n, ring_rank=i, zigzag=zigzag) for i in range(n)]
    pos = positions[r]
    local = [t[:, :, pos].clone().requires_grad_() for t in (q, k, v)]
    out = ring_attention(*local, group=group, positions=positions, causal=causal)
    out.backward(do[:, :, pos])
    errs = {"out": (out - ref[:, :, pos]).abs().max().item()}
    for name, loc, glob in zip("qkv", local, full, strict=True):
        errs[f"d{name}"] = (loc.grad - glob.grad[:, :, pos]).abs().max().item()
    return {key: _max(val) for key, val in errs.items()}


def moe_case(group, capacity_factor: float) -> dict[str, float]:
    """EP MoE on each rank's rows vs the same layer on one rank routing the rows in n groups."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    cfg = ModelConfig.model_validate(
        {**PRESETS["tiny"].config.model_dump(), "num_experts": 4, "top_k": 2, "capacity_factor": capacity_factor}
    )
    torch.manual_seed(0)
    ref_layer = MoE(cfg)
    for p in ref_layer.parameters():
        torch.nn.init.normal_(p, std=0.1)
    ref_layer.route_groups = n
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2 * n, 8, cfg.hidden_size, generator=g)
    gy = torch.randn(2 * n, 8, cfg.hidden_size, generator=g)
    xr = x.clone().requires_grad_()
    ref_out = ref_layer(xr)
    ((ref_out * gy).sum() + ref_layer.aux_loss).backward()

    ep = MoE(cfg)
    ep.load_state_dict(ref_layer.state_dict())
    ep = shard_experts(torch.nn.Sequential(ep), group)[0]
    rows = slice(2 * r, 2 * r + 2)
    xl = x[rows].clone().requires_grad_()
    out = ep(xl)
    ((out * gy[rows]).sum() + ep.aux_loss / n).backward()  # Σ over ranks = the reference's objective
    router_grad = ep.router.weight.grad.clone()
    dist.all_reduce(router_grad, group=group)  # replicated params: every rank's share, summed
    lo = ep.expert_offset
    errs = {
        "out": (out - ref_out[rows]).abs().max().item(),
        "dx": (xl.grad - xr.grad[rows]).abs().max().item(),
        "drouter": (router_grad - ref_layer.router.weight.grad).abs().max().item(),
        "dropped": float(abs(_sum(ep.stat_dropped, group) - int(ref_layer.stat_dropped))),
        "aux": abs(_sum_f(ep.aux_loss.detach(), group) / n - ref_layer.aux_loss.item()),
    }
    for name in ("w1", "w2", "w3"):
        mine = getattr(ep, name).grad
        errs[f"d{name}"] = (mine - getattr(ref_layer, name).grad[lo : lo + ep.num_local_experts]).abs().max().item()
    return {key: _max(val) for key, val in errs.items()} | {"dropped_total": float(ref_layer.stat_dropped)}


def _sum(t: torch.Tensor, group) -> int:
    t = t.clone()
    dist.all_reduce(t, group=group)
    return int(t)


def _sum_f(t: torch.Tensor, group) -> float:
    t = t.clone().float()
    dist.all_reduce(t, group=group)
    return float(t)


def main() -> None:
    out = start()
    world, rank = dist.get_world_size(), dist.get_rank()
    halves = [dist.new_group([0, 1]), dist.new_group([2, 3])] if world == 4 else []
    groups = {world: dist.group.WORLD}
    if halves:
        groups[2] = halves[rank // 2]
    results: dict[str, dict[str, float]] = {}
    for size, group in groups.items():
        for causal in (True, False):
            for zigzag in (False, True):
                results[f"ring n={size} causal={causal} zigzag={zigzag}"] = ring_case(group, causal, zigzag)
        results[f"moe n={size} no-drop"] = moe_case(group, capacity_factor=64.0)  # the bound: ample for every token
        results[f"moe n={size} drops"] = moe_case(group, capacity_factor=0.5)
    finish(results, out)


if __name__ == "__main__":
    main()
