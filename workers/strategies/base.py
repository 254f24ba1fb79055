"""The rank half of a strategy: what every rank module implements, and the defaults it inherits.

Two modules define a `Strategy`: `single.py` (the one-process reference, exposed as `STRATEGY`)
and `compose.py` (every layout preset, one instance a name in `STRATEGIES`), each typed by its
options model (the descriptor's, `parallab.core.strategies`) and by what its `apply` returns. The
dimensions' modules (`ddp.py`, `fsdp.py`, `pipeline.py`, …) are the composition's steps. The
entry point has the same shape everywhere:

    apply(model, ctx, options) -> Applied

It takes the full model (built on CPU, identical on every rank), places, shards or slices it on
the rank's mesh (`ctx.mesh`) and returns the module the optimizer trains — plus, for the
pipeline, its schedule state (a subclass of `Applied`). The shared loop (`workers.harness.loop`)
then calls the hooks below; the defaults are one process's:

- `local_batch(inputs, labels, ctx, options, micro_step) -> MicroBatch`: this rank's part of one
  accumulation micro-step of the global batch (default: the row block `data_rank` names — the
  whole micro-step for one process; the composition splits it over the data-parallel dims);
- `accumulate(applied, last) -> context manager`: around a non-final micro-step (DDP's no_sync);
- `forward_backward(applied, batch, ctx, options, amp) -> loss`: the pipeline's schedule step
  replaces the default forward + backward;
- `sync_grads(applied, ctx, options)`: once per optimizer step, after the last backward (gradient
  all-reduce of ring attention and expert parallelism);
- `loss_weight(ctx, options) -> float`: this rank's share in the global mean loss (default
  1/world: every rank holds an equal share; pipeline: the last stage holds it all);
- `progress_rank(ctx, options) -> int`: the rank that writes the live progress lines (default 0;
  pipeline: the last stage, the only one that has a loss).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from parallab.core.strategies.base import StrategyOptions
from workers.harness.amp import Amp
from workers.harness.data import micro_batch
from workers.harness.model import Transformer
from workers.harness.runtime import RunContext


@dataclass(frozen=True)
class MicroBatch:
    """One rank's rows of one accumulation micro-step."""

    inputs: torch.Tensor
    labels: torch.Tensor
    positions: torch.Tensor | None = None
    """Global token positions when a rank holds a slice of the sequence (ring attention)."""

    def to(self, device: torch.device) -> MicroBatch:
        return MicroBatch(
            self.inputs.to(device, non_blocking=True),
            self.labels.to(device, non_blocking=True),
            self.positions.to(device, non_blocking=True) if self.positions is not None else None,
        )


@dataclass(frozen=True)
class Applied:
    """What `apply` returns: the module the optimizer trains (strategies with more state subclass it)."""

    model: nn.Module


OptionsT = TypeVar("OptionsT", bound=StrategyOptions)
A = TypeVar("A", bound=Applied)
M = TypeVar("M", bound=nn.Module)


class Strategy(ABC, Generic[OptionsT, A]):
    """A strategy on the rank side; subclasses implement `apply` and override the hooks that differ."""

    name: str
    """The strategy's name in `parallab.core.strategies.REGISTRY`."""

    @abstractmethod
    def apply(self, model: Transformer, ctx: RunContext, options: OptionsT) -> A:
        """Place, shard or slice `model` on this rank's mesh."""

    def data_rank(self, ctx: RunContext, options: OptionsT) -> tuple[int, int]:
        """(data-parallel degree, this rank's index among them): which row block of each micro-step
        the rank takes (`micro_batch`). Default: one process takes every row."""
        return 1, 0

    def local_batch(self, inputs: torch.Tensor, labels: torch.Tensor, ctx: RunContext, options: OptionsT, micro_step: int) -> MicroBatch:
        dp, r = self.data_rank(ctx, options)
        return MicroBatch(
            micro_batch(inputs, accum_steps=ctx.accum_steps, micro_step=micro_step, dp_degree=dp, dp_rank=r),
            micro_batch(labels, accum_steps=ctx.accum_steps, micro_step=micro_step, dp_degree=dp, dp_rank=r),
        )

    def accumulate(self, applied: A, last: bool) -> AbstractContextManager[object]:
        return contextlib.nullcontext()

    def forward_backward(self, applied: A, batch: MicroBatch, ctx: RunContext, options: OptionsT, amp: Amp) -> torch.Tensor:
        """Forward to the loss, scale for accumulation, backward; `amp` carries autocast and the loss scale."""
        with amp.autocast():
            loss = applied.model(batch.inputs, labels=batch.labels, positions=batch.positions) / ctx.accum_steps
        amp.backward(loss)
        return loss.detach()

    def sync_grads(self, applied: A, ctx: RunContext, options: OptionsT) -> None:
        return None

    def loss_weight(self, ctx: RunContext, options: OptionsT) -> float:
        return 1.0 / ctx.world_size

    def progress_rank(self, ctx: RunContext, options: OptionsT) -> int:
        return 0


def place(model: M, device: torch.device) -> M:
    """`model` on `device`; left as it is when every parameter is there already — a dry run's
    fake tensors (`workers.dryrun`) claim the device but cannot be moved (`Module.to` swaps them)."""
    if any(p.device != device for p in model.parameters()):
        model = model.to(device)
    return model


def local_grad(grad: torch.Tensor) -> torch.Tensor:
    """This rank's part of a gradient: a DTensor's local shard (FSDP, TP: a view, so writing it
    writes the gradient), a plain tensor as it is."""
    return grad.to_local() if isinstance(grad, DTensor) else grad


def flat_all_reduce_(tensors: list[torch.Tensor], group: dist.ProcessGroup, *, scale: float = 1.0) -> None:
    """Sum `tensors` over `group` in ONE all-reduce (flattened), then multiply by `scale`, in place."""
    if not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    flat.mul_(scale)
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n
