"""The replica check: every copy that should be identical, compared across the ranks that hold it.

The gradient check makes each parameter whole from one copy (rank 0's, or a DTensor's
`full_tensor()`, which reads the local replica): a copy on another rank that drifted away — a DDP
gradient one rank never all-reduced, a TP-replicated norm reduced on one rank only — passes it.
This check compares the copies themselves, twice: step 0's gradients after the strategy's sync
(beside the gradient check, before any optimizer step) and the parameters after the last step.

Which ranks should agree, per parameter, follows from how each rank holds it: a parameter's copy
is keyed by its plain-model name plus the coordinate of every mesh dim over which it is sharded —
a DTensor's dims that are not `Replicate` (FSDP, TP, HSDP's shard dim, FSDP-over-TP's strided
shard), an expert-parallel MoE layer's expert slice (the "ep" coordinate). Ranks with the same
key hold the same shard and must hold the same numbers: DDP and HSDP replicas, TP-replicated
norms and biases, ring attention's and MoE's replicated weights and router, a pipeline's copies
across its data-parallel groups. A key held by one rank only (a pipeline stage's own layers, an
FSDP shard) has nothing to compare.

How: each rank sends a float64 checksum of each copy (sum, sum of squares) to all ranks; where
the copies of one key disagree, the copies themselves are exchanged and their max relative
difference, max |copy − first| / max |first| against the lowest rank's copy, is taken. The
tolerance is the gradient check's (`gradcheck.tolerance`: fp32 1e-5 — correct replicas are
bitwise equal after an all-reduce; autocast formats are allowed more). A divergence names the
parameter (with its shard) and the ranks whose copies differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate

from parallab.core.result import ReplicaCheck, ReplicaDivergence
from workers.harness.gradcheck import canonical, expert_slices
from workers.harness.runtime import RunContext

METHOD = (
    "copies keyed by parameter and sharded mesh coordinates; float64 checksum across ranks, then max |copy - first| / max |first| "
    "where checksums differ; at step 0's synced gradients and at the final parameters"
)
Key = str
DIFF_CAP = 1e30
"""A non-finite difference (shapes that differ, a zero copy against a non-zero one) is stored as this."""
Moment = Literal["step-0 gradients", "final parameters"]


@dataclass
class Scan:
    """One moment's comparison: the divergent copies, and how many keys more than one rank held."""

    of: Moment
    compared: int = 0
    worst: ReplicaDivergence | None = None
    """The largest difference found, within the tolerance or not."""
    divergent: list[ReplicaDivergence] = field(default_factory=list)
    """The copies beyond the tolerance."""


def _copies(model: nn.Module, ctx: RunContext, *, grads: bool) -> dict[Key, torch.Tensor]:
    """This rank's copy of each parameter (or its gradient), keyed so that ranks holding the same
    shard share a key: name, then `[dim=coordinate]` for every dim it is sharded over."""
    experts = expert_slices(model)
    out: dict[Key, torch.Tensor] = {}
    for name, p in model.named_parameters():
        value = p.grad if grads else p
        if value is None:
            continue
        shard: list[str] = []
        if isinstance(value, DTensor):
            if any(placement.is_partial() for placement in value.placements):
                # A pending sum (sequence-parallel norms' gradients): the copy is what the sum gives.
                value = value.redistribute(placements=[Replicate() if q.is_partial() else q for q in value.placements])
            mesh = value.device_mesh
            coordinate: list[int] = list(mesh.get_coordinate() or [])
            names = mesh.mesh_dim_names or tuple(str(i) for i in range(mesh.ndim))
            # Any placement but Replicate splits the tensor over that dim (FSDP over TP is a
            # `_StridedShard`, which does not say `is_shard()`): its coordinate is part of the key.
            shard = [f"{names[i]}={coordinate[i]}" for i, placement in enumerate(value.placements) if not placement.is_replicate()]
            value = value.to_local()
        if id(p) in experts:  # its slice of the experts, FSDP-sharded over other dims or not
            shard.append(f"ep={ctx.mesh_dim('ep').get_local_rank()}")
        out[canonical(name) + (f"[{','.join(shard)}]" if shard else "")] = value.detach()
    return out


def _checksum(t: torch.Tensor) -> tuple[float, float]:
    x = t.double()
    return float(x.sum()), float((x * x).sum())


def _rel_diff(copy: torch.Tensor, first: torch.Tensor) -> float:
    if copy.shape != first.shape:
        return float("inf")
    scale = float(first.double().abs().max()) if first.numel() else 0.0
    diff = float((copy.double() - first.double()).abs().max()) if first.numel() else 0.0
    if scale == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / scale


def scan(model: nn.Module, ctx: RunContext, *, of: Moment, grads: bool, tol: float) -> Scan:
    """Compare every rank's copies (collective: every rank calls it); the result is the same on all ranks."""
    result = Scan(of=of)
    if not (dist.is_initialized() and ctx.world_size > 1):
        return result
    mine = _copies(model, ctx, grads=grads)
    sums: list[dict[Key, tuple[float, float]] | None] = [None] * ctx.world_size
    dist.all_gather_object(sums, {k: _checksum(v) for k, v in mine.items()})
    holders: dict[Key, list[int]] = {}
    for rank, per_rank in enumerate(sums):
        for key in per_rank or {}:
            holders.setdefault(key, []).append(rank)
    shared = {k: ranks for k, ranks in holders.items() if len(ranks) > 1}
    result.compared = len(shared)
    differ = sorted(k for k, ranks in shared.items() if len({(sums[r] or {})[k] for r in ranks}) > 1)
    if not differ:
        return result
    # Only the copies whose checksums disagree travel, to every rank (all ranks take part).
    tensors: list[dict[Key, torch.Tensor] | None] = [None] * ctx.world_size
    dist.all_gather_object(tensors, {k: mine[k].float().cpu() for k in differ if k in mine})
    for key in differ:
        ranks = shared[key]
        first = (tensors[ranks[0]] or {})[key]
        diffs = {r: _rel_diff((tensors[r] or {})[key], first) for r in ranks[1:]}
        worst = min(max(diffs.values()), DIFF_CAP)
        away = [r for r, d in diffs.items() if d > tol] or [max(diffs, key=lambda r: diffs[r])]
        found = ReplicaDivergence(param=key, ranks=[ranks[0], *away], rel_diff=worst, of=of)
        if result.worst is None or worst > result.worst.rel_diff:
            result.worst = found
        if worst > tol:
            result.divergent.append(found)
    return result


def verdict(scans: Sequence[Scan], *, tol: float) -> ReplicaCheck:
    """The run's replica check from its scans (step 0's gradients, the final parameters)."""
    divergent = [d for s in scans for d in s.divergent]
    worst = max((s.worst for s in scans if s.worst is not None), key=lambda d: d.rel_diff, default=None)
    return ReplicaCheck(
        passed=not divergent,
        tolerance=tol,
        max_rel_diff=worst.rel_diff if worst else 0.0,
        worst_param=worst.param if worst else None,
        worst_ranks=worst.ranks if worst else [],
        copies_compared=sum(s.compared for s in scans),
        divergent=sorted(divergent, key=lambda d: -d.rel_diff)[:1000],
        method=METHOD,
    )
