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
from workers.harness.runtime import RunContext


def gloo_context(job: ResolvedJob) -> RunContext:
    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", tuple(d.size for d in job.mesh), mesh_dim_names=tuple(d.name for d in job.mesh))
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
