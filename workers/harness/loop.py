"""The one training loop every strategy shares (the reference run included).

Per optimizer step: the step's global batch (`data.global_batch`, seeded by seed + step), then
for each accumulation micro-step the strategy's `local_batch` and `forward_backward`, then the
strategy's `sync_grads`, then AdamW. Warm-up steps run first and are neither timed nor profiled.
Each measured step is timed between two device synchronisations, with nothing watching it: no
profiler, no collective recording. A traced job's profiled window (`measure.StepProfiler`) runs its
extra steps after the measured ones; their losses, times and MoE routing are not the run's.

Losses stay local during the measured steps — combining them is one all-reduce *after* them
(`global_losses`), so the loss bookkeeping adds no collective to the communication measured.
One rank (rank 0; a pipeline's last stage, which holds the loss) appends a line per step to
the run's progress file (`RunDir.progress`) for the live UI, with its local loss; rank 0 adds the reference run's lines.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from parallab.core.jobs import ResolvedJob
from parallab.core.rundir import RunDir
from parallab.core.strategies.base import StrategyOptions
from workers import hostspeed
from workers.harness import divergence
from workers.harness.amp import Amp
from workers.harness.data import global_batch
from workers.harness.measure import StepProfiler, device_peaks, live_memory_bytes, reset_device_peaks
from workers.harness.model import MoE
from workers.harness.runtime import RunContext
from workers.strategies.base import Applied, Strategy

BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.0


class Progress:
    """Appends progress lines to the run's progress file (one rank only), for the live run page.

    A step line is {"phase", "step", "steps", "loss", "step_time_s", "tokens_per_s",
    "memory_bytes", "t"}; a phase line (`phase(...)`) marks a stretch without steps (the
    gradient check, the profiled window, storing). `t` is the wall-clock time of the line."""

    def __init__(self, run_dir: RunDir | None, enabled: bool):
        self.path = run_dir.progress if (run_dir is not None and enabled) else None

    def write(self, phase: str, step: int, steps: int, loss: float | None, **measured: float | int | None) -> None:
        self._append({"phase": phase, "step": step, "steps": steps, "loss": loss, **measured})

    def phase(self, phase: str, *, steps: int | None = None) -> None:
        """Mark the start of a phase that reports no steps of its own."""
        self._append({"phase": phase, "step": 0, "steps": steps, "loss": None})

    def _append(self, line: dict[str, Any]) -> None:
        if self.path is None:
            return
        with self.path.open("a") as fh:
            fh.write(json.dumps({**line, "t": round(time.time(), 3)}) + "\n")
            fh.flush()


@dataclass
class TrainResult:
    optimizer: torch.optim.Optimizer
    losses: list[torch.Tensor] = field(default_factory=list)
    """This rank's local loss of each measured step (its share of the global mean)."""
    step_times_s: list[float] = field(default_factory=list)
    peak_allocated_bytes: int | None = None
    """The CUDA allocator's peak over the measured steps (parameters included); None on CPU."""
    peak_reserved_bytes: int | None = None
    probe_before: list[float] = field(default_factory=list)
    """The host-speed probe's rate (ops/s) right before the measured steps, on this rank (`workers.hostspeed`)."""
    probe_after: list[float] = field(default_factory=list)
    """The same right after them."""


def moe_layers(model: torch.nn.Module) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


def train(
    *,
    applied: Applied,
    strategy: Strategy[Any, Any],
    options: StrategyOptions,
    ctx: RunContext,
    job: ResolvedJob,
    progress: Progress,
    profiler: StepProfiler | None = None,
    phase: str = "train",
) -> TrainResult:
    """Warm-up, then the measured (timed) steps, then — when `profiler` is given — its profiled
    window of extra steps, which neither the losses nor the step times include."""
    wl = job.workload
    model = applied.model
    optimizer = torch.optim.AdamW(model.parameters(), lr=wl.lr, betas=BETAS, weight_decay=WEIGHT_DECAY)
    amp = Amp(wl.precision, ctx.device.type)
    result = TrainResult(optimizer=optimizer)

    def one_step(step: int) -> torch.Tensor:
        inputs, labels = global_batch(job.model, global_batch_size=job.global_batch_size, seed=wl.seed, step=step, data=wl.data)
        # Grads of the previous step are dropped here, not after the step: the last step's grads
        # stay held so model-state bytes are measured with them.
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=ctx.device)
        for micro in range(ctx.accum_steps):
            batch = strategy.local_batch(inputs, labels, ctx, options, micro).to(ctx.device)
            with strategy.accumulate(applied, micro == ctx.accum_steps - 1):
                total += strategy.forward_backward(applied, batch, ctx, options, amp).float()
        strategy.sync_grads(applied, ctx, options)
        amp.step(optimizer, ctx)
        return total

    def report(step: int, warmup: bool, loss: torch.Tensor, seconds: float) -> None:
        """The training run counts warm-up and measured steps apart; the reference run as one.
        Each line carries the step's time, its tokens/s and this rank's memory now."""
        if progress.path is None:
            return
        value = float(loss.item()) if strategy.loss_weight(ctx, options) > 0 else None
        stage = phase if phase != "train" else ("warmup" if warmup else "train")
        divergence.check_loss(value, phase=stage, step=step + 1, rank=ctx.rank)  # Stop a diverged run now
        measured = {
            "step_time_s": seconds,
            "tokens_per_s": job.tokens_per_step / seconds if seconds > 0 else None,
            "memory_bytes": live_memory_bytes(ctx.device),
        }
        if phase != "train":
            progress.write(phase, step + 1, wl.warmup_steps + wl.steps, value, **measured)
        elif warmup:
            progress.write("warmup", step + 1, wl.warmup_steps, value, **measured)
        else:
            progress.write("train", step + 1 - wl.warmup_steps, wl.steps, value, **measured)

    for i in range(wl.warmup_steps):
        start = time.perf_counter()
        loss = one_step(i)
        report(i, True, loss, time.perf_counter() - start)
    for moe in moe_layers(model):
        moe.reset_stats()

    # The host's speed right before and after the measured steps, every rank at once (one lane
    # per rank): what the steps' timings saw of the host's load, outside the timed steps.
    result.probe_before = hostspeed.rates(hostspeed.IN_STEPS)
    reset_device_peaks(ctx.device)
    for i in range(wl.steps):
        ctx.synchronize()
        start = time.perf_counter()
        loss = one_step(wl.warmup_steps + i)
        ctx.synchronize()
        result.step_times_s.append(time.perf_counter() - start)
        result.losses.append(loss.detach())
        report(wl.warmup_steps + i, False, loss, result.step_times_s[-1])
    result.probe_after = hostspeed.rates(hostspeed.IN_STEPS)
    result.peak_allocated_bytes, result.peak_reserved_bytes = device_peaks(ctx.device)

    if profiler is not None:
        routed = [(m.stat_routed.clone(), m.stat_dropped.clone()) for m in moe_layers(model)]
        first = wl.warmup_steps + wl.steps
        if phase == "train":
            progress.phase("profile", steps=profiler.steps)
        profiler.run(lambda i: one_step(first + i), model=model, optimizer=optimizer, synchronize=ctx.synchronize)
        for m, (tokens, dropped) in zip(moe_layers(model), routed, strict=True):
            m.stat_routed, m.stat_dropped = tokens, dropped  # routing stats: the measured steps only
    return result


def global_losses(result: TrainResult, *, weight: float, ctx: RunContext) -> list[float]:
    """Global mean loss of each measured step: Σ over ranks of weight × local loss, one all-reduce."""
    local = torch.stack(result.losses).to(ctx.device).float() * weight
    if dist.is_initialized() and ctx.world_size > 1:
        dist.all_reduce(local)
    return [float(x) for x in local.cpu()]


def moe_stats(model: torch.nn.Module, *, ctx: RunContext) -> dict[str, Any] | None:
    """Tokens routed per expert (all layers, all ranks, measured steps), imbalance, dropped slots."""
    layers = moe_layers(model)
    if not layers:
        return None
    routed = torch.stack([m.stat_routed.to(ctx.device) for m in layers]).sum(0)
    dropped = torch.stack([m.stat_dropped.to(ctx.device) for m in layers]).sum()
    stats = torch.cat([routed, dropped[None]])
    if dist.is_initialized() and ctx.world_size > 1:
        dist.all_reduce(stats)
    *per_expert, total_dropped = stats.cpu().tolist()
    mean = sum(per_expert) / len(per_expert)
    return {"tokens_per_expert": per_expert, "imbalance": (max(per_expert) / mean) if mean else 0.0, "dropped_tokens": int(total_dropped)}
