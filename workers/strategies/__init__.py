"""Strategy registry: a name → the module that applies that parallelism.

Every strategy module has the same entry point, `apply(model, ctx, options) -> model`: it takes
the full model (built on CPU, identical on every rank), places, shards or slices it on the rank's
mesh (`ctx.mesh`) and returns the module the optimizer trains. The shared loop
(`workers.harness.loop`) then asks the module, where it has them, for these hooks — defaults
below are the plain data-parallel behaviour:

- `local_batch(inputs, labels, ctx, options, micro_step) -> MicroBatch`: this rank's part of one
  accumulation micro-step of the global batch (default: data-parallel split over the "dp" mesh dim
  when the mesh has one, else the whole micro-step);
- `accumulate(model, last) -> context manager`: around a non-final micro-step (DDP's no_sync);
- `forward_backward(model, batch, ctx, options, run) -> loss`: the pipeline's schedule step
  replaces the default forward + backward;
- `sync_grads(model, ctx, options)`: once per optimizer step, after the last backward (gradient
  all-reduce of ring attention and expert parallelism);
- `loss_weight(ctx, options) -> float`: this rank's share in the global mean loss (default
  1/world: every rank holds an equal share; pipeline: the last stage holds it all);
- `progress_rank(ctx, options) -> int`: the rank that writes the live progress lines (default 0;
  pipeline: the last stage, the only one that has a loss).

Composition order where strategies combine is fixed: TP, then context parallel, then FSDP or DDP
(torchtitan's). Only `hybrid` composes (TP then FSDP); the others never import each other.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

import torch

from workers.harness.data import micro_batch

MODULES: dict[str, str] = {
    "single": "single",
    "ddp": "ddp",
    "fsdp": "fsdp",
    "tp": "tensor_parallel",
    "pp": "pipeline",
    "ring": "ring_attention",
    "moe": "expert_parallel",
    "hybrid": "hybrid",
}


@dataclass
class MicroBatch:
    inputs: torch.Tensor
    labels: torch.Tensor
    positions: torch.Tensor | None = None
    """Global token positions when a rank holds a slice of the sequence (ring attention)."""

    def to(self, device: torch.device) -> "MicroBatch":
        move = lambda t: t.to(device, non_blocking=True) if t is not None else None  # noqa: E731
        return MicroBatch(move(self.inputs), move(self.labels), move(self.positions))


def dp_coordinate(ctx: Any) -> tuple[int, int]:
    """(data-parallel degree, this rank's index) from the mesh's "dp" dim; (1, 0) without one."""
    mesh = getattr(ctx, "mesh", None)
    if mesh is None or "dp" not in (mesh.mesh_dim_names or ()):
        return 1, 0
    sub = mesh["dp"] if mesh.ndim > 1 else mesh
    return sub.size(), sub.get_local_rank()


def default_local_batch(inputs: torch.Tensor, labels: torch.Tensor, ctx: Any, options: dict[str, Any], micro_step: int) -> MicroBatch:
    dp, r = dp_coordinate(ctx)
    take = lambda t: micro_batch(t, accum_steps=ctx.accum_steps, micro_step=micro_step, dp_degree=dp, dp_rank=r)  # noqa: E731
    return MicroBatch(take(inputs), take(labels))


def default_forward_backward(model: torch.nn.Module, batch: MicroBatch, ctx: Any, options: dict[str, Any], run: Any) -> torch.Tensor:
    """Forward to the loss, scale for accumulation, backward. `run` carries autocast and scaler."""
    with run.autocast():
        loss = model(batch.inputs, labels=batch.labels, positions=batch.positions) / ctx.accum_steps
    run.backward(loss)
    return loss.detach()


@dataclass(frozen=True)
class Strategy:
    """A strategy module with the optional hooks filled in by the defaults."""

    name: str
    module: ModuleType
    apply: Callable[..., torch.nn.Module]
    local_batch: Callable[..., MicroBatch]
    accumulate: Callable[..., Any]
    forward_backward: Callable[..., torch.Tensor]
    sync_grads: Callable[..., None]
    loss_weight: Callable[..., float]
    progress_rank: Callable[..., int]


def get(name: str) -> Strategy:
    if name not in MODULES:
        raise KeyError(f"unknown strategy {name!r}; known: {', '.join(MODULES)}")
    mod = importlib.import_module(f"{__name__}.{MODULES[name]}")
    hook = lambda attr, default: getattr(mod, attr, default)  # noqa: E731
    return Strategy(
        name=name,
        module=mod,
        apply=mod.apply,
        local_batch=hook("local_batch", default_local_batch),
        accumulate=hook("accumulate", lambda model, last: contextlib.nullcontext()),
        forward_backward=hook("forward_backward", default_forward_backward),
        sync_grads=hook("sync_grads", lambda model, ctx, options: None),
        loss_weight=hook("loss_weight", lambda ctx, options: 1.0 / ctx.world_size),
        progress_rank=hook("progress_rank", lambda ctx, options: 0),
    )


def flat_all_reduce_(tensors: list[torch.Tensor], group: Any, *, scale: float = 1.0) -> None:
    """Sum `tensors` over `group` in ONE all-reduce (flattened), then multiply by `scale`, in place."""
    import torch.distributed as dist

    if not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    flat.mul_(scale)
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset:offset + n].view_as(t))
        offset += n
