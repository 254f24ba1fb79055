"""The rank context a test driver (launched by torchrun, gloo on CPU) builds for one job: the
same fields `workers.harness.runtime.init_runtime` fills, without initialising the process group
again (a driver runs many jobs in one group)."""

from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from parallab.core.jobs import ResolvedJob
from tests.workers.conftest import make_job
from workers import strategies
from workers.harness import gradcheck, loop
from workers.harness.main import compute_reference, new_model, reference_gradients
from workers.harness.runtime import RunContext


def gloo_context(job: ResolvedJob) -> RunContext:
    world, rank = dist.get_world_size(), dist.get_rank()
    shape = tuple(d.size for d in job.mesh)  # none for `single`: no mesh, as `init_runtime` leaves it
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=tuple(d.name for d in job.mesh)) if shape else None
    return RunContext(
        rank=rank,
        world_size=world,
        local_rank=rank,
        local_world_size=world,
        device=torch.device("cpu"),
        backend="gloo",
        accum_steps=job.accum_steps,
        precision=job.workload.precision,
        mesh=mesh,
    )


def start() -> Path:
    """A driver's opening: its `--out` path, the gloo group torchrun set up, one thread per rank
    (the ranks share the host's cores)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    out: Path = parser.parse_args().out
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    return out


def finish(results: dict[str, Any], out: Path | str) -> None:
    """Rank 0 writes the driver's results as JSON; every rank then waits for it and leaves the
    group (a rank that left first would break rank 0's last collective).

    The wrapped models a driver built sit in reference cycles (DDP's reducer, FSDP's hooks, a
    pipeline's stages) that keep gloo's process groups and their pending work alive; collected
    only at interpreter shutdown, their worker threads can outlive the interpreter and abort the
    rank ("terminate called without an active exception"). A collection first ends them while
    Python is whole."""
    gc.collect()
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(results, indent=1))
    dist.barrier()
    dist.destroy_process_group()


def family_reference(workload: dict[str, Any]) -> dict[str, Any] | None:
    """On rank 0, what a family's cases are held against: the fp32 `single` run of `workload`'s
    step-0 gradients, its loss curve and its model's parameter count (None on the other ranks)."""
    if dist.get_rank() != 0:
        return None
    job = make_job("single", 1, workload=workload, trace=False)
    solo = gloo_context(make_job("ddp", 2, workload=workload, trace=False))
    return {
        "gradients": reference_gradients(job, solo),
        "curve": compute_reference(job, solo, loop.Progress(None, False)),
        "params": sum(p.numel() for p in new_model(job).parameters()),
    }


def family_case(
    workload: dict[str, Any], strategy_name: str, options: dict[str, Any], reference: dict[str, Any] | None
) -> dict[str, Any] | None:
    """One strategy on `workload` at 2 ranks as a run does it (`main.new_model`, the strategy, the
    gradient check's own code, the shared training loop), held against `reference` on rank 0:
    the parameter count, the gradient check's verdict and the loss curve's largest relative
    difference (None on the other ranks)."""
    job = make_job(strategy_name, 2, options, workload=workload, trace=False)
    ctx = gloo_context(job)
    strategy = strategies.get(job.strategy)
    model = new_model(job)
    params = sum(p.numel() for p in model.parameters())
    applied = strategy.apply(model, ctx, job.options)
    grads = gradcheck.strategy_gradients(applied, strategy, job.options, ctx, job)
    result = loop.train(applied=applied, strategy=strategy, options=job.options, ctx=ctx, job=job, progress=loop.Progress(None, False))
    losses = loop.global_losses(result, weight=strategy.loss_weight(ctx, job.options), ctx=ctx)
    if reference is None or grads is None:
        return None
    check = gradcheck.compare(grads, reference["gradients"], tol=gradcheck.tolerance(job.workload.precision))
    curve = reference["curve"]
    return {
        "params": params,
        "gradient_check": check.model_dump(exclude={"per_param", "method"}),
        "losses": losses,
        "reference": curve,
        "loss_max_rel_diff": max(abs(a - b) / abs(b) for a, b in zip(losses, curve, strict=True)),
    }
