"""Autocast and the fp16 loss scale of one run, handed to the strategies' `forward_backward`.

The fp16 scaler is our own rather than torch.amp.GradScaler: that one unscales with a foreach
kernel that refuses a mix of DTensor and plain grads (TP keeps norms as plain tensors) and cannot
see into the pipeline schedule's backward. Here every grad is unscaled on its own; a non-finite
grad on any rank skips the step on every rank (one all-reduce per fp16 step).
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from parallab.core.spec import Precision
from workers.harness.runtime import RunContext

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Amp:
    """The run's precision recipe; `scale` is the current fp16 loss scale (1 otherwise)."""

    precision: Precision
    device_type: str
    scale: float = 1.0
    good_steps: int = 0

    GROWTH_INTERVAL = 2000

    def __post_init__(self) -> None:
        if self.precision == "fp16":
            self.scale = 2.0**16

    def autocast(self) -> AbstractContextManager[object]:
        if self.precision in DTYPES:
            return torch.autocast(device_type=self.device_type, dtype=DTYPES[self.precision])
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        (loss * self.scale if self.scale != 1.0 else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer, ctx: RunContext) -> None:
        if self.precision != "fp16":
            optimizer.step()
            return
        bad = torch.zeros((), device=ctx.device)
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.mul_(1.0 / self.scale)
                    local = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                    bad = torch.maximum(bad, (~torch.isfinite(local)).any().float())
        if dist.is_initialized() and ctx.world_size > 1:
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        if bad.item():
            self.scale /= 2
            self.good_steps = 0
            return
        optimizer.step()
        self.good_steps += 1
        if self.good_steps % self.GROWTH_INTERVAL == 0:
            self.scale *= 2
