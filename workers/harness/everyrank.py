"""Timing on every rank at once, as the calibrate job measures (`workers.harness.calibrate`,
`workers.harness.wrapped_blocks`): each point runs on all ranks together between barriers and its
time is the slowest rank's (one all-reduce MAX), so CPU ranks sharing cores report what each gets
while the others work; and the block's training step that both time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from workers.harness.amp import DTYPES

MIN_TIMED_S = 0.2
"""Seconds of calls each point is timed over, at least (many scheduler slices of ranks sharing cores)."""
BLOCK_TOKEN_COUNTS = 2
"""The block is timed at this many of the smallest token counts (a run's tokens per forward are few)."""
BLOCK_RECOMPUTE = ("none", "selective", "full")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def slowest(seconds: float, device: torch.device, world_size: int) -> float:
    """The slowest rank's time (every rank gets the same answer)."""
    if world_size <= 1 or not dist.is_initialized():
        return seconds
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def timed(call: Callable[[], object], iters: int, device: torch.device, world_size: int, min_seconds: float = MIN_TIMED_S) -> float:
    """Seconds per call of `call`, all ranks together: one untimed call (its slowest rank's time
    sets the count: at least `iters`, and enough for `min_seconds`, one for a call that takes
    longer), a barrier, that many timed."""
    start = time.perf_counter()
    call()
    _sync(device)
    first = slowest(time.perf_counter() - start, device, world_size)
    if min_seconds > 0:
        iters = max(1 if first >= min_seconds else iters, math.ceil(min_seconds / max(first, 1e-9)))
    if world_size > 1 and dist.is_initialized():
        dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    _sync(device)
    return slowest((time.perf_counter() - start) / iters, device, world_size)


def gemm_dtype(precision: str) -> torch.dtype:
    """The dtype a precision's GEMMs run in (fp8's are timed as its bf16 fallback: torchao's
    scaled GEMM is measured by an fp8 training run, not here)."""
    return DTYPES.get(precision, torch.float32)


def block_step(block: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, precision: str) -> None:
    """One block's forward and backward as a training step runs it: fresh gradients (a step's first
    micro-step), autocast in a 16-bit precision, a dense gradient from above (the next block's)."""
    block.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=gemm_dtype(precision), enabled=precision != "fp32"):
        out = block(x, cos, sin)
    out.backward(grad.to(out.dtype))
