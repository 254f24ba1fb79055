"""torchrun script (not a test module): every recipe under ddp, fsdp and tp in ONE launch.

Launched by test_recipes.py at 2 ranks. For each (strategy, recipe) it resolves the job as the
API would, builds the rank's model with the harness (`main.new_model`: recomputation, fp8),
applies the strategy on a fresh mesh over the same process group, trains with the shared loop
under the StepProfiler the harness uses (so the peak is the result document's
`peak_allocated_bytes`), and combines the losses; then it runs one more step under
`torch.distributed._tools.mem_tracker.MemTracker`, whose activation peak is what
`memory_breakdown.activations` will carry once the harness records it (issue 9). Rank 0 trains
the fp32 reference once (`main.compute_reference`). Results go to --out as JSON from rank 0: per
case the loss curve, the max peaks over ranks and the prediction's activation bytes.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from parallab.core.prediction import predict
from tests.workers.conftest import make_job
from tests.workers.driver_context import finish, gloo_context, start
from workers import strategies
from workers.harness import loop, main, measure
from workers.harness.amp import Amp
from workers.harness.data import global_batch
from workers.harness.runtime import RunContext
from workers.harness.torchtools import MemTracker

RECIPES: dict[str, dict[str, Any]] = {
    "fp32": {},
    "bf16": {"precision": "bf16"},
    "fp16": {"precision": "fp16"},
    "selective": {"activation_checkpointing": "selective"},
    "alternate": {"activation_checkpointing": "alternate"},
    "full": {"activation_checkpointing": "full"},
    "accum2": {"grad_accumulation_steps": 2},
}
STRATEGIES = ("ddp", "fsdp", "tp")
WORKLOAD = {"global_batch_size": 16}
"""Twice the preset's batch: activations dominate the peak, so the recipes' memory shows."""


def run_case(strategy_name: str, recipe: dict[str, Any], rank: int, world: int, out_dir: Path) -> dict[str, Any]:
    job = make_job(strategy_name, world, workload={**WORKLOAD, **recipe})
    ctx = gloo_context(job)
    strategy = strategies.get(job.strategy)
    applied = strategy.apply(main.new_model(job), ctx, job.options)
    # One profiled step after the MemTracker one (the least the profiler runs): only that step's
    # peak is read here, none of the window's comm or timeline.
    profiler = measure.StepProfiler(rank=rank, world_size=world, out_dir=out_dir, device=ctx.device, window=1)
    result = loop.train(
        applied=applied, strategy=strategy, options=job.options, ctx=ctx, job=job, progress=loop.Progress(None, False), profiler=profiler
    )
    losses = loop.global_losses(result, weight=strategy.loss_weight(ctx, job.options), ctx=ctx)
    activations = tracked_activations(job, strategy, applied, result.optimizer, ctx)
    peaks = torch.tensor([profiler.results().peak_allocated_bytes or 0, activations], dtype=torch.int64)
    dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
    return {
        "losses": losses,
        "peak_allocated_bytes": int(peaks[0]),
        "activation_bytes": int(peaks[1]),
        "predicted_activation_bytes": predict(job)["activation_bytes_per_rank"],
        "precision": job.workload.precision,
    }


def tracked_activations(job, strategy, applied, optimizer, ctx: RunContext) -> int:
    """MemTracker's activation bytes at the peak of one more training step of the job."""
    inputs, labels = global_batch(job.model, global_batch_size=job.global_batch_size, seed=job.workload.seed, step=1000)
    amp = Amp(job.workload.precision, ctx.device.type)
    tracker = MemTracker()
    tracker.track_external(applied.model, optimizer)
    with tracker:
        optimizer.zero_grad(set_to_none=True)
        for micro in range(ctx.accum_steps):
            if micro:
                tracker.reset_mod_stats()  # per-module stats are per forward; the peak is kept
            batch = strategy.local_batch(inputs, labels, ctx, job.options, micro)
            with strategy.accumulate(applied, micro == ctx.accum_steps - 1):
                strategy.forward_backward(applied, batch, ctx, job.options, amp)
        strategy.sync_grads(applied, ctx, job.options)
        optimizer.step()
    peak = tracker.get_tracker_snapshot("peak")
    return int(sum(v for stats in peak.values() for k, v in stats.items() if str(k).endswith("ACT")))


def main_() -> None:
    out = start()
    world, rank = dist.get_world_size(), dist.get_rank()
    results: dict[str, Any] = {"cases": {}}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"recipes-rank{rank}-") as tmp:
        for name in STRATEGIES:
            for recipe_name, recipe in RECIPES.items():
                results["cases"][f"{name}/{recipe_name}"] = run_case(name, recipe, rank, world, Path(tmp))
    if rank == 0:
        job = make_job("ddp", world, workload=WORKLOAD)
        solo = RunContext(rank=0, world_size=1, local_rank=0, local_world_size=1, device=torch.device("cpu"), backend="none")
        results["reference"] = main.compute_reference(job, solo, loop.Progress(None, False))
        results["seconds"] = time.perf_counter() - started
    finish(results, out)


if __name__ == "__main__":
    main_()
