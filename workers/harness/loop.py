"""The one training loop every strategy shares (the reference run included).

Per optimizer step: the step's global batch (`data.global_batch`, seeded by seed + step), then
for each accumulation micro-step the strategy's `local_batch` and `forward_backward`, then the
strategy's `sync_grads`, then AdamW. Warm-up steps run first and are neither timed nor profiled.
Each measured step is timed between two device synchronisations.

Losses stay local during the measured window — combining them is one all-reduce *after* it
(`global_losses`), so the loss bookkeeping adds no collective to the communication measured.
Rank 0 appends a line per step to `progress.jsonl` for the live UI (its local loss; on a
pipeline's first stage, which has no loss, null).
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
    """Appends {"phase", "step", "steps", "loss"} lines to progress.jsonl (lead rank only)."""

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
    """Autocast and (fp16 only) loss scaling, handed to the strategies' forward_backward."""

    name: str
    device_type: str
    scaler: Any = None

    def __post_init__(self) -> None:
        if self.name == "fp16":
            self.scaler = torch.amp.GradScaler(self.device_type)

    def autocast(self) -> Any:
        if self.name in DTYPES:
            return torch.autocast(device_type=self.device_type, dtype=DTYPES[self.name])
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()


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
        precision.step(optimizer)
        return total

    def report(ph: str, i: int, n: int, loss: torch.Tensor) -> None:
        if progress.path is not None:
            has_loss = strategy.loss_weight(ctx, options) > 0
            progress.write(ph, i, n, float(loss.item()) if has_loss else None)

    for i in range(wl.warmup_steps):
        report("warmup" if phase == "train" else phase, i, wl.warmup_steps, one_step(i))
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
            report(phase, i, wl.steps, loss)
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
    routed = torch.stack([m.stat_routed for m in layers]).sum(0)
    stats = torch.cat([routed, torch.stack([m.stat_dropped for m in layers]).sum()[None]]).to(ctx.device)
    if dist.is_initialized() and ctx.world_size > 1:
        dist.all_reduce(stats)
    stats = stats.cpu().tolist()
    per_expert, dropped = stats[:-1], stats[-1]
    mean = sum(per_expert) / len(per_expert)
    return {"tokens_per_expert": per_expert, "imbalance": (max(per_expert) / mean) if mean else 0.0, "dropped_tokens": int(dropped)}
