"""Autocast, fp8 and the fp16 loss scale of one run, handed to the strategies' `forward_backward`.

Precisions (the workload's `precision`): fp32; bf16 and fp16 under autocast with fp32 master
weights, gradients and AdamW state (fp16 with the dynamic loss scale below); fp8 through
torchao's float8 training (`convert_to_float8_training`: each eligible nn.Linear becomes a
Float8Linear with tensorwise dynamic scaling — e4m3 forward, e5m2 gradients — under bf16
autocast for everything else; FSDP all-gathers its weights in fp8). torchao is an optional extra
(`pip install parallab[fp8]`), imported only by fp8 runs.

Before a rank builds anything it asks the core whether its own device can train in the
precision (`parallab.core.hardware.precision_problem`): fp8 on a CPU or a pre-Hopper GPU fails
the run at once with the device's reason, not deep inside a kernel.

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

from parallab.core.families import family_of
from parallab.core.hardware import DeviceDescription, precision_problem
from parallab.core.spec import Precision
from workers.harness.model import Transformer
from workers.harness.runtime import RunContext

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}
"""The autocast dtype of each precision (fp8: the matmuls are Float8Linear's, the rest bf16)."""
FP8_ALIGNMENT = 16
"""torch._scaled_mm wants both dims of a weight divisible by 16."""


class PrecisionUnsupported(RuntimeError):
    """This rank's device cannot train in the job's precision (the message is the device's reason)."""


def describe_device(device: torch.device) -> DeviceDescription:
    """The core's description of this rank's device."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return DeviceDescription(
            kind="rocm" if getattr(torch.version, "hip", None) else "cuda",
            name=props.name,
            capability=(props.major, props.minor),
            memory_bytes=int(props.total_memory),
        )
    return DeviceDescription(kind="cpu", name=None)


def require_precision(precision: str, device: torch.device) -> None:
    """Raise PrecisionUnsupported with the device's reason when it cannot train in `precision`."""
    problem = precision_problem(precision, describe_device(device))
    if problem is not None:
        raise PrecisionUnsupported(problem)


def convert_to_fp8(model: Transformer, *, fsdp_all_gather: bool) -> int:
    """Swap the eligible nn.Linear layers for torchao's Float8Linear; returns how many.

    Eligible: both weight dims divisible by 16 (torch._scaled_mm), and not the LM head (its
    logits feed the loss; torchtitan keeps it in bf16 too).
    """
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as exc:
        raise PrecisionUnsupported(
            f"fp8 needs torchao's float8 training, which is not installed here ({exc}); pip install 'parallab[fp8]'"
        ) from None

    swapped = 0
    heads = family_of(model.cfg).head_modules(model.cfg)

    def eligible(module: torch.nn.Module, fqn: str) -> bool:
        nonlocal swapped
        ok = (
            isinstance(module, torch.nn.Linear)
            and fqn not in heads
            and module.in_features % FP8_ALIGNMENT == 0
            and module.out_features % FP8_ALIGNMENT == 0
        )
        swapped += int(ok)
        return ok

    convert_to_float8_training(model, module_filter_fn=eligible, config=Float8LinearConfig(enable_fsdp_float8_all_gather=fsdp_all_gather))
    return swapped


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
