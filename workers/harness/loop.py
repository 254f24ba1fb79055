"""The one training loop every strategy shares (the reference run included).

Per optimizer step: the step's global batch (`data.global_batch`, seeded by seed + step), then
for each accumulation micro-step the strategy's `local_batch` and `forward_backward`, then the
strategy's `sync_grads`, then AdamW. Warm-up steps run first and are neither timed nor profiled.
Each measured step is timed between two device synchronisations.

Losses stay local during the measured window — combining them is one all-reduce *after* it
(`global_losses`), so the loss bookkeeping adds no collective to the communication measured.
One rank (rank 0; a pipeline's last stage, which holds the loss) appends a line per step to
`progress.jsonl` for the live UI, with its local loss; rank 0 adds the reference run's lines.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from backend.services.validation import ResolvedJob
from workers.harness.data import global_batch
from workers.harness.model import MoE

BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.0
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Progress:
    """Appends {"phase", "step", "steps", "loss"} lines to progress.jsonl (one rank only)."""

    def __init__(self, run_dir: Path | None, enabled: bool):
        self.path = run_dir / "progress.jsonl" if (run_dir is not None and enabled) else None

    def write(self, phase: str, step: int, steps: int, loss: float | None) -> None:
        if self.path is None:
            return
        with self.path.open("a") as fh:
            fh.write(json.dumps({"phase": phase, "step": step, "steps": steps, "loss": loss}) + "\n")
            fh.flush()


@dataclass
class Precision:
    """Autocast, and for fp16 a dynamic loss scale, handed to the strategies' forward_backward.

    The fp16 scaler is our own rather than torch.amp.GradScaler: that one unscales with a foreach
    kernel that refuses a mix of DTensor and plain grads (TP keeps norms as plain tensors) and
    cannot see into the pipeline schedule's backward. Here every grad is unscaled on its own; a
    non-finite grad on any rank skips the step on every rank (one all-reduce per fp16 step).
    """

    name: str
    device_type: str
    scale: float = 1.0
    good_steps: int = 0

    GROWTH_INTERVAL = 2000

    def __post_init__(self) -> None:
        if self.name == "fp16":
            self.scale = 2.0**16

    def autocast(self) -> Any:
        if self.name in DTYPES:
            return torch.autocast(device_type=self.device_type, dtype=DTYPES[self.name])
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        (loss * self.scale if self.scale != 1.0 else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer, ctx: Any) -> None:
        if self.name != "fp16":
            optimizer.step()
            return
        bad = torch.zeros((), device=ctx.device)
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.mul_(1.0 / self.scale)
                    local = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
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


@dataclass
class TrainResult:
    optimizer: torch.optim.Optimizer
    losses: list[torch.Tensor] = field(default_factory=list)
    """This rank's local loss of each measured step (its share of the global mean)."""
    step_times_s: list[float] = field(default_factory=list)


def moe_layers(model: torch.nn.Module) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


def train(*, model: torch.nn.Module, strategy: Any, ctx: Any, job: ResolvedJob, progress: Progress, profiler: Any = None, phase: str = "train") -> TrainResult:
    """Warm-up then measured steps; `profiler` (a StepProfiler) wraps the measured ones only."""
    wl = job.spec.workload
    options = job.options
    optimizer = torch.optim.AdamW(model.parameters(), lr=wl.lr, betas=BETAS, weight_decay=WEIGHT_DECAY)
    precision = Precision(wl.precision, ctx.device.type)
    result = TrainResult(optimizer=optimizer)

    def one_step(step: int) -> torch.Tensor:
        inputs, labels = global_batch(job.model, global_batch_size=job.global_batch_size, seed=wl.seed, step=step)
        # Grads of the previous step are dropped here, not after the step: the last step's grads
        # stay held so model-state bytes are measured with them.
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=ctx.device)
        for micro in range(ctx.accum_steps):
            batch = strategy.local_batch(inputs, labels, ctx, options, micro).to(ctx.device)
            with strategy.accumulate(model, micro == ctx.accum_steps - 1):
                total += strategy.forward_backward(model, batch, ctx, options, precision).float()
        strategy.sync_grads(model, ctx, options)
        precision.step(optimizer, ctx)
        return total

    def report(step: int, warmup: bool, loss: torch.Tensor) -> None:
        """The training run counts warm-up and measured steps apart; the reference run as one."""
        if progress.path is None:
            return
        value = float(loss.item()) if strategy.loss_weight(ctx, options) > 0 else None
        if phase != "train":
            progress.write(phase, step, wl.warmup_steps + wl.steps, value)
        elif warmup:
            progress.write("warmup", step, wl.warmup_steps, value)
        else:
            progress.write("train", step - wl.warmup_steps, wl.steps, value)

    for i in range(wl.warmup_steps):
        report(i, True, one_step(i))
    for moe in moe_layers(model):
        moe.reset_stats()

    with profiler if profiler is not None else contextlib.nullcontext():
        for i in range(wl.steps):
            ctx.synchronize()
            start = time.perf_counter()
            loss = one_step(wl.warmup_steps + i)
            ctx.synchronize()
            result.step_times_s.append(time.perf_counter() - start)
            result.losses.append(loss.detach())
            if profiler is not None:
                profiler.step()
            report(wl.warmup_steps + i, False, loss)
    return result


def global_losses(result: TrainResult, *, weight: float, ctx: Any) -> list[float]:
    """Global mean loss of each measured step: Σ over ranks of weight × local loss, one all-reduce."""
    local = torch.stack(result.losses).to(ctx.device).float() * weight
    if dist.is_initialized() and ctx.world_size > 1:
        dist.all_reduce(local)
    return [float(x) for x in local.cpu()]


def moe_stats(model: torch.nn.Module, *, ctx: Any) -> dict[str, Any] | None:
    """Tokens routed per expert (all layers, all ranks, measured steps), imbalance, dropped slots."""
    layers = moe_layers(model)
    if not layers:
        return None
    routed = torch.stack([m.stat_routed.to(ctx.device) for m in layers]).sum(0)
    dropped = torch.stack([m.stat_dropped.to(ctx.device) for m in layers]).sum()
    stats = torch.cat([routed, dropped[None]])
    if dist.is_initialized() and ctx.world_size > 1:
        dist.all_reduce(stats)
    stats = stats.cpu().tolist()
    per_expert, dropped = stats[:-1], stats[-1]
    mean = sum(per_expert) / len(per_expert)
    return {"tokens_per_expert": per_expert, "imbalance": (max(per_expert) / mean) if mean else 0.0, "dropped_tokens": int(dropped)}
