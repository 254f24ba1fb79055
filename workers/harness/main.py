"""Rank entry point: `python -m torch.distributed.run --standalone --nproc-per-node N
-m workers.harness.main --spec SPEC.json --run-dir DIR [--cache-dir CACHE]`.

Every strategy, `single` included, runs this one path: resolve the spec again (the rules live in
backend.services.validation), set up the rank (runtime), build the seeded model on CPU, let the
strategy shard it, train with the shared loop under the StepProfiler, combine the losses once,
then — on rank 0, with the trained model freed — obtain the `single` reference curve (computed
here, or read from the cache) and write `rank{r}.json` (the record `workers.aggregate` merges).
Any exception exits non-zero with its traceback on stderr; the process group is always destroyed.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib.metadata
import json
import os
import platform
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from backend.schemas.spec import JobSpec
from backend.services.validation import ResolvedJob, resolve_job
from workers.harness import loop, measure
from workers.harness.model import apply_activation_checkpointing, build_model
from workers.harness.runtime import RunContext, init_runtime, shutdown
from workers import strategies


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="workers.harness.main")
    parser.add_argument("--spec", type=Path, required=True, help="ResolvedJob.to_spec_dict() as JSON")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--cache-dir", type=Path, default=None, help="reference loss curves, by workload hash")
    return parser.parse_args(argv)


def load_job(path: Path, world_size: int) -> ResolvedJob:
    return resolve_job(JobSpec.model_validate(json.loads(path.read_text())), max_world_size=world_size)


def aux_loss_coef(job: ResolvedJob) -> float:
    return float(job.options.get("aux_loss_coef", 0.01))


def new_model(job: ResolvedJob, *, route_groups: int = 1) -> torch.nn.Module:
    model = build_model(job.model, seed=job.spec.workload.seed, aux_loss_coef=aux_loss_coef(job), route_groups=route_groups)
    apply_activation_checkpointing(model, job.spec.workload.activation_checkpointing)
    return model


# ---- the reference: the `single` curve of the same workload ----


def reference_key(job: ResolvedJob) -> str:
    """sha256 of the workload block; MoE adds its routing groups and aux weight (they shape the loss)."""
    block: dict[str, Any] = job.workload_document()
    if job.model.is_moe:
        block = {"workload": block, "route_groups": job.dp_degree, "aux_loss_coef": aux_loss_coef(job)}
    return hashlib.sha256(json.dumps(block, sort_keys=True).encode()).hexdigest()


def compute_reference(job: ResolvedJob, ctx: RunContext, progress: loop.Progress) -> list[float]:
    """Train the plain model on one device (no collectives), routing MoE in dp groups (expert_parallel.py)."""
    single = strategies.get("single")
    solo = RunContext(rank=0, world_size=1, local_rank=0, local_world_size=1, device=ctx.device, backend="none", accum_steps=ctx.accum_steps, precision=ctx.precision)
    model = single.apply(new_model(job, route_groups=job.dp_degree if job.model.is_moe else 1), solo, {})
    result = loop.train(model=model, strategy=single, ctx=solo, job=job, progress=progress, phase="reference")
    return [float(x) for x in torch.stack(result.losses).cpu()]


def reference_curve(job: ResolvedJob, ctx: RunContext, cache_dir: Path | None, progress: loop.Progress, own: list[float]) -> list[float]:
    """`single` is its own reference (and fills the cache); the others read the cache or compute it."""
    path = cache_dir / f"{reference_key(job)}.json" if cache_dir is not None else None
    if job.strategy == "single":
        curve = own
    elif path is not None and path.exists():
        return json.loads(path.read_text())["loss"]
    else:
        curve = compute_reference(job, ctx, progress)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"workload": job.workload_document(), "loss": curve}))
        tmp.replace(path)
    return curve


# ---- what rank 0 adds ----


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware(ctx: RunContext) -> dict[str, Any]:
    cuda = ctx.device.type == "cuda"
    try:
        import psutil

        memory = psutil.virtual_memory().total
    except ImportError:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "device": ctx.device.type,
        "device_name": torch.cuda.get_device_name(ctx.device) if cuda else _cpu_name(),
        "device_count": torch.cuda.device_count() if cuda else 1,
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": memory,
    }


def environment(ctx: RunContext) -> dict[str, Any]:
    try:
        version = importlib.metadata.version("parallab")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return {"torch": torch.__version__, "python": platform.python_version(), "backend": ctx.backend, "parallab_version": version}


def write_record(run_dir: Path, rank: int, record: dict[str, Any]) -> None:
    tmp = run_dir / f".rank{rank}.json.tmp"
    tmp.write_text(json.dumps(record))
    tmp.replace(run_dir / f"rank{rank}.json")


# ---- the two job kinds ----


def run_collectives(job: ResolvedJob, ctx: RunContext, run_dir: Path) -> None:
    from workers.harness import collectives  # written separately; a job of this kind needs it

    start = time.perf_counter()
    points = collectives.run_collectives(ctx.rank, ctx.world_size, ctx.device, job.options)
    total = time.perf_counter() - start
    record: dict[str, Any] = {
        "rank": ctx.rank,
        "model_state_bytes": {"params": 0, "grads": 0, "optimizer": 0},
        "peak_rss_bytes": measure.peak_rss_bytes(),
        "step_times_s": [total],
    }
    if ctx.is_lead:
        record.update(collectives=points, loss={"values": [], "reference": None}, hardware=hardware(ctx), environment=environment(ctx))
    write_record(run_dir, ctx.rank, record)


def run_training(job: ResolvedJob, ctx: RunContext, run_dir: Path, cache_dir: Path | None) -> None:
    strategy = strategies.get(job.strategy)
    progress = loop.Progress(run_dir, ctx.rank == strategy.progress_rank(ctx, job.options))
    model = strategy.apply(new_model(job), ctx, job.options)
    profiler = measure.StepProfiler(enabled=True, trace=job.spec.trace, rank=ctx.rank, world_size=ctx.world_size, out_dir=run_dir, device=ctx.device)
    result = loop.train(model=model, strategy=strategy, ctx=ctx, job=job, progress=progress, profiler=profiler)

    # After the measured window: the collectives of the bookkeeping, then the measurements.
    losses = loop.global_losses(result, weight=strategy.loss_weight(ctx, job.options), ctx=ctx)
    moe = loop.moe_stats(model, ctx=ctx)
    record: dict[str, Any] = {
        "rank": ctx.rank,
        "model_state_bytes": measure.model_state_bytes(model, result.optimizer),
        "step_times_s": result.step_times_s,
    }
    record.update(profiler.results())
    if moe is not None:
        record["moe"] = moe
    record["peak_rss_bytes"] = measure.peak_rss_bytes()  # before rank 0's reference run adds its own

    del model, result, profiler
    gc.collect()  # the pipeline schedule and its stage reference the module: cycles
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
    if ctx.is_lead:
        reference = reference_curve(job, ctx, cache_dir, loop.Progress(run_dir, True), own=losses)
        record.update(loss={"values": losses, "reference": reference}, hardware=hardware(ctx), environment=environment(ctx))
    write_record(run_dir, ctx.rank, record)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    code = 0
    try:
        args.run_dir.mkdir(parents=True, exist_ok=True)
        job = load_job(args.spec, int(os.environ.get("WORLD_SIZE", 1)))
        ctx = init_runtime(job.strategy, job.options)
        ctx.accum_steps = job.spec.workload.grad_accumulation_steps
        ctx.precision = job.spec.workload.precision
        if job.strategy == "collectives":
            run_collectives(job, ctx, args.run_dir)
        else:
            run_training(job, ctx, args.run_dir, args.cache_dir)
        if dist.is_initialized() and ctx.world_size > 1:
            dist.barrier()  # nobody tears the group down while rank 0 still computes the reference
    except BaseException:  # noqa: BLE001 — any failure: traceback to stderr, non-zero exit
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
        code = 1
    finally:
        shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
