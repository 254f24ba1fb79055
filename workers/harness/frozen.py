"""The end-of-run check: a parameter that stopped training after the gradient check's step.

The gradient check reads one step (step 0, before warm-up); a fault that starts after it — a
gradient zeroed, a parameter left out of the optimizer, a shard never written back — trains a
curve that can stay inside the loss tolerance (bf16's 2e-2 hides a frozen attention output
projection over 20 steps; fp32's 1e-5 a frozen final norm over 4). Its signature is simple: a
parameter whose gradient was non-zero at the check's step has not moved by the end.

How: at the check's step (`snapshot`, called where the synced gradients are in place) each rank
copies its own shard of every parameter whose local gradient is non-zero (fp32, on the CPU, one
copy of the rank's parameters: what the optimizer's own state costs a third of). After the last
optimizer step (`verdict`) it measures each one's motion as ‖p_end − c·p_0‖ / ‖p_0‖ with c the
least-squares scale (⟨p_end, p_0⟩ / ⟨p_0, p_0⟩) — a parameter only rescaled has moved by weight
decay alone, not by its gradient (the harness trains with none, `loop.WEIGHT_DECAY`; the fit
keeps the check right if it ever does) — and a shard whose motion is at most `TOLERANCE` is frozen. A
parameter that starts at zero is measured by ‖p_end‖ alone. Rank 0 gathers every rank's list.

`TOLERANCE` 1e-6: a frozen shard moves by rounding only (0 without decay; one fp32 rounding of a
decayed product is ~3e-8, and n decayed steps' roundings add up to ~√n of those), while AdamW
moves every element with a gradient by about lr per step, so a trained parameter's motion is
≳ lr/rms(p) — 1e-3 at lr 1e-5 for weights of rms 1e-2, 1e-5 for norms of ones (measured on tiny
at lr 1e-2: 1.2e-2 to 2.1e-2 least motion over clean runs). A run at a learning rate below ~1e-6
could be flagged without a fault.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from parallab.core.result import FrozenCheck
from workers.harness.gradcheck import canonical
from workers.harness.runtime import RunContext

TOLERANCE = 1e-6
"""Least relative motion (beyond a rescaling) of a parameter that had a gradient (module docstring)."""
METHOD = (
    "each rank's shard of every parameter with a non-zero gradient at the check's step, copied there and held "
    "after the last step: frozen if ||p_end - c p_0|| / ||p_0|| <= tolerance (c: the least-squares scale)"
)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


@dataclass
class Snapshot:
    """Each rank's shards at the check's step, by canonical name."""

    start: dict[str, torch.Tensor]


def snapshot(model: nn.Module) -> Snapshot:
    """Copy this rank's shard of every parameter whose local gradient is non-zero (at the check's step)."""
    start: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        grad = p.grad
        if grad is None:
            continue
        local = _local(p.detach())
        if local.numel() and bool(_local(grad).detach().ne(0).any()):
            start[canonical(name)] = local.float().cpu().clone()
    return Snapshot(start)


def motion(start: torch.Tensor, end: torch.Tensor) -> float:
    """‖end − c·start‖ / ‖start‖ with c the least-squares scale (‖end‖ where start is zero), in float64."""
    p0, p1 = start.double().flatten(), end.double().flatten()
    norm0 = float(p0.norm())
    if norm0 == 0.0:
        return float(p1.norm())
    c = float(p1 @ p0) / norm0**2
    return float((p1 - c * p0).norm()) / norm0


def measure(model: nn.Module, snap: Snapshot) -> dict[str, float]:
    """This rank's motion of every snapshotted shard (a name the model no longer holds counts as 0)."""
    now = {canonical(name): _local(p.detach()) for name, p in model.named_parameters()}
    return {name: motion(start, now[name].float().cpu()) if name in now else 0.0 for name, start in snap.start.items()}


def verdict(model: nn.Module, snap: Snapshot, ctx: RunContext, *, last_step: int) -> FrozenCheck | None:
    """Every rank's motions gathered on rank 0 and judged there (None on the other ranks). Collective."""
    mine = measure(model, snap)
    parts: list[dict[str, float] | None] = [mine]
    if dist.is_initialized() and ctx.world_size > 1:
        parts = [None] * ctx.world_size
        dist.all_gather_object(parts, mine)
    if ctx.rank != 0:
        return None
    motions = {f"{name} (rank {rank})": m for rank, part in enumerate(parts) for name, m in (part or {}).items()}
    frozen = sorted((name for name, m in motions.items() if m <= TOLERANCE), key=lambda n: motions[n])
    least = min(motions, key=lambda n: motions[n]) if motions else None
    return FrozenCheck(
        passed=not frozen,
        tolerance=TOLERANCE,
        min_motion=motions[least] if least is not None else 0.0,
        least_moved=least,
        params_checked=len(motions),
        frozen=frozen[:1000],
        from_step=0,
        to_step=last_step,
        method=METHOD,
    )
