"""The gradient check: the first step's gradients of a strategy against the `single` reference.

The loss curve cannot catch a constant-factor gradient error: AdamW divides each gradient element
by its own running RMS, so a strategy that sums gradients where it should average them (a missing
1/N) trains the same curve to about 1e-7. The gradients themselves show it at once.

How (`METHOD`): before warm-up every rank runs one extra forward, backward and `sync_grads` on step
0's global batch — exactly the loop's step (`loop.train`), accumulation and the recipe included —
but never steps the optimizer, so training is unchanged; this step is neither timed nor profiled.
Each parameter's gradient is then made whole under its full, unsharded name (a DTensor's — FSDP, TP,
hybrid — by `full_tensor()`, an expert-parallel MoE layer's expert slices by an all-gather over the
"ep" dim (after FSDP's `full_tensor()` where FSDP shards them too), a pipeline stage's by sending to
rank 0 what rank 0 lacks; DDP's `module.` prefix dropped). Rank 0 keeps the whole set on disk in the
run directory while the run trains (no copy held during the measured steps), then — with the trained
model freed, where the reference loss curve is computed — runs the same step on the fp32 `single`
model of the reference workload (`main.reference_job`, MoE routed in the same dp groups, to the
experts the run's ranks chose where they can be gathered: `workers.harness.routing`) and
compares, per parameter, ‖g − g_ref‖ / ‖g_ref‖ in float64. A parameter one side lacks counts as
error 1.

Tolerance (`tolerance`): fp32 1e-5 — only the order of sums differs (measured: a few 1e-7 on the
tiny preset). A 16-bit run compares rounded gradients with fp32's, and how much rounding costs
depends on the format and the workload (bf16 has 8 significant bits, ~4e-3 per rounding,
compounded through the layers; measured on tiny ×2: bf16 1.0e-2, fp16 1.3e-3). So its tolerance
is derived from its own noise: `NOISE_FACTOR` (2) × the worst error of `single` in the run's
precision against the fp32 reference on the same workload (rank 0 computes both after training,
`main.checks_after_training`), never looser than the flat bound (`GRADIENT_TOLERANCE`: 5e-2
bf16/fp16, 0.25 fp8, untested: no Hopper GPU) nor tighter than fp32's. A clean strategy measured
1.0–1.36 × its noise on tiny (fsdp the most: it casts norms to bf16); a ring attention leaking
one future token across each hop 3.1 × (it passed the flat 5e-2). docs/recipes.md derives it.
Each still fails a missing 1/N (error N−1 ≥ 1) or a dropped half of a 2-way shard (≈0.7).
Memory: rank 0 holds one fp32 copy of the model's gradients while gathering (before warm-up) and
while comparing (after training), as the reference run already holds a whole model there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from parallab.core.jobs import ResolvedJob
from parallab.core.result import GradientCheck
from workers.harness.amp import Amp
from workers.harness.data import global_batch
from workers.harness.model import ExpertLayer
from workers.harness.runtime import RunContext
from workers.strategies.base import Applied, Strategy

GRADIENT_TOLERANCE: dict[str, float] = {"fp32": 1e-5, "bf16": 5e-2, "fp16": 5e-2, "fp8": 0.25}
"""Max ‖g − g_ref‖/‖g_ref‖ per parameter against the fp32 reference, by precision (module docstring)."""
METHOD = "first step (before warm-up, optimizer not stepped): full per-parameter gradients vs fp32 single, ||g - g_ref|| / ||g_ref||"
ERROR_CAP = 1e30
"""A non-finite or unbounded error is stored as this (the document holds finite numbers only)."""
WRAPPERS = frozenset({"module", "_orig_mod", "_checkpoint_wrapped_module"})
"""Name components wrappers add (DDP, torch.compile, checkpoint_wrapper); the plain model has none."""

Gradients = dict[str, torch.Tensor]


NOISE_FACTOR = 2.0
"""A 16-bit run's tolerance: this many times the noise of its format on the workload (module docstring)."""
NOISE_FLOOR = GRADIENT_TOLERANCE["fp32"]
"""The derived tolerance never falls below fp32's (a format whose noise measured ~0 on a workload)."""


def tolerance(precision: str, noise: float | None = None) -> float:
    """The flat bound of `precision`; for a 16-bit run whose noise was measured, `NOISE_FACTOR` × that
    noise, held between `NOISE_FLOOR` and the flat bound (never looser than it)."""
    flat = GRADIENT_TOLERANCE.get(precision, GRADIENT_TOLERANCE["fp8"])
    if precision == "fp32" or noise is None:
        return flat
    return min(flat, max(NOISE_FACTOR * noise, NOISE_FLOOR))


def tolerance_rule(precision: str, noise: float | None) -> str:
    """What the stored tolerance is, in words (the result document's `tolerance_rule`)."""
    flat = GRADIENT_TOLERANCE.get(precision, GRADIENT_TOLERANCE["fp8"])
    if precision == "fp32" or noise is None:
        return f"flat {flat:g} ({precision})"
    return f"{NOISE_FACTOR:g} x the noise of {precision} (single in {precision} vs fp32: {noise:.3g}), within [{NOISE_FLOOR:g}, {flat:g}]"


def canonical(name: str) -> str:
    """The parameter's name in the plain `Transformer` (wrappers' components dropped)."""
    return ".".join(part for part in name.split(".") if part not in WRAPPERS)


def first_step_backward(applied: Applied, strategy: Strategy[Any, Any], options: Any, ctx: RunContext, job: ResolvedJob) -> Amp:
    """Step 0's forward, backward and gradient sync as the loop runs them, without the optimizer step;
    returns the `Amp` used (its loss scale divides the gradients back)."""
    wl = job.workload
    amp = Amp(wl.precision, ctx.device.type)
    inputs, labels = global_batch(job.model, global_batch_size=job.global_batch_size, seed=wl.seed, step=0, data=wl.data)
    applied.model.zero_grad(set_to_none=True)
    for micro in range(ctx.accum_steps):
        batch = strategy.local_batch(inputs, labels, ctx, options, micro).to(ctx.device)
        with strategy.accumulate(applied, micro == ctx.accum_steps - 1):
            strategy.forward_backward(applied, batch, ctx, options, amp)
    strategy.sync_grads(applied, ctx, options)
    return amp


def expert_slices(model: nn.Module) -> dict[int, ExpertLayer]:
    """id(parameter) → its expert layer, for expert weights sliced over ranks (expert parallelism)."""
    return {
        id(w): m
        for m in model.modules()
        if isinstance(m, ExpertLayer) and m.num_local_experts < m.num_experts
        for w in m.experts().values()
    }


def _ep_group(ctx: RunContext) -> dist.ProcessGroup:
    return ctx.mesh_dim("ep").get_group()


def gather_gradients(model: nn.Module, ctx: RunContext, *, scale: float = 1.0) -> Gradients | None:
    """Every parameter's whole gradient (fp32, CPU) by canonical name on rank 0; None on the others.

    Collective: every rank calls it, in the same parameter order (a strategy's ranks hold the same
    parameter list, except pipeline stages, which hold plain tensors and need no collective here)."""
    experts = expert_slices(model)
    mine: Gradients = {}
    for name, p in model.named_parameters():
        grad = p.grad
        if isinstance(p, DTensor) or isinstance(grad, DTensor):
            full = grad.full_tensor() if isinstance(grad, DTensor) else torch.zeros(p.shape)
        else:
            full = grad if grad is not None else torch.zeros(p.shape)
        if id(p) in experts:  # this rank's experts (whole over FSDP's dims, above): all of them over "ep"
            group = _ep_group(ctx)
            parts = [torch.empty_like(full) for _ in range(dist.get_world_size(group))]
            dist.all_gather(parts, full.contiguous(), group=group)
            full = torch.cat(parts, dim=0)
        mine[canonical(name)] = full.detach().float().cpu() / scale
    if not (dist.is_initialized() and ctx.world_size > 1):
        return mine
    # Names rank 0 lacks (pipeline stages): the lowest rank holding each sends it.
    names: list[list[str] | None] = [None] * ctx.world_size
    dist.all_gather_object(names, sorted(mine))
    held = set(names[0] or [])
    owner: dict[str, int] = {}
    for r, rank_names in enumerate(names):
        for n in rank_names or []:
            if n not in held:
                owner.setdefault(n, r)
    if owner:
        send = {n: t for n, t in mine.items() if owner.get(n) == ctx.rank}
        received: list[Gradients | None] = [None] * ctx.world_size
        dist.gather_object(send, received if ctx.rank == 0 else None, dst=0)
        if ctx.rank == 0:
            for part in received:
                mine.update(part or {})
    return mine if ctx.rank == 0 else None


def strategy_gradients(
    applied: Applied,
    strategy: Strategy[Any, Any],
    options: Any,
    ctx: RunContext,
    job: ResolvedJob,
    *,
    on_synced: Callable[[nn.Module], object] | None = None,
) -> Gradients | None:
    """The strategy's step-0 gradients, whole, on rank 0 (None elsewhere); the model's grads are cleared after.

    `on_synced` sees the model with its synced gradients before they are gathered (the replica
    check compares every rank's copies there: gathering reads one copy only)."""
    amp = first_step_backward(applied, strategy, options, ctx, job)
    if on_synced is not None:
        on_synced(applied.model)
    grads = gather_gradients(applied.model, ctx, scale=amp.scale)
    applied.model.zero_grad(set_to_none=True)
    return grads


def relative_error(grad: torch.Tensor | None, ref: torch.Tensor | None) -> float:
    """‖g − g_ref‖ / ‖g_ref‖ in float64 (1 for a parameter one side lacks or shapes that differ)."""
    if grad is None or ref is None or grad.shape != ref.shape:
        return 1.0
    diff = float((grad.double() - ref.double()).norm())
    norm = float(ref.double().norm())
    if not math.isfinite(diff):
        return ERROR_CAP
    if norm == 0.0:
        return 0.0 if diff == 0.0 else 1.0
    return min(diff / norm, ERROR_CAP)


def compare(
    grads: Mapping[str, torch.Tensor],
    reference: Mapping[str, torch.Tensor],
    *,
    tol: float,
    noise: float | None = None,
    rule: str | None = None,
) -> GradientCheck:
    """Per-parameter errors of `grads` against `reference`, the worst one, and the verdict (with the
    measured noise and the rule that set `tol`, where given)."""
    errors = {name: relative_error(grads.get(name), reference.get(name)) for name in sorted(set(grads) | set(reference))}
    worst = max(errors, key=lambda n: errors[n]) if errors else None
    worst_err = errors[worst] if worst is not None else 0.0
    return GradientCheck(
        passed=worst_err <= tol,
        tolerance=tol,
        max_rel_err=worst_err,
        worst_param=worst,
        params_checked=len(errors),
        method=METHOD,
        per_param=errors,
        step=0,
        noise_max_rel_err=noise,
        tolerance_rule=rule,
    )


def save(grads: Gradients, path: Path) -> None:
    torch.save(grads, path)


def load(path: Path) -> Gradients:
    grads: Gradients = torch.load(path, weights_only=True)
    return grads
