"""Device, backend, process group and device mesh of one rank — passed around, never global.

CUDA available → NCCL, one rank per GPU by LOCAL_RANK; otherwise CPU ranks on gloo. Meshes are
built with the rank's own device type ("cpu" on CPU: FSDP2 over gloo with a cuda mesh crashes).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


@dataclass
class RunContext:
    """What a rank knows about where it runs; strategies read their mesh dims from `mesh`."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str
    mesh: DeviceMesh | None = None
    """Named dims per strategy: dp, tp, pp, cp, ep — or ("dp", "tp") for hybrid."""
    accum_steps: int = 1
    """Gradient-accumulation micro-steps per optimizer step (the workload's recipe)."""
    precision: str = "fp32"

    @property
    def is_lead(self) -> bool:
        return self.rank == 0

    def synchronize(self) -> None:
        """Wait for queued device work so a clock read means the step is done."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def mesh_shape(strategy: str, world_size: int, options: dict[str, Any]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The mesh each strategy runs on (hybrid: dp outer, tp inner — TP wants the closer ranks)."""
    if strategy == "hybrid":
        tp = options["tp"]
        return (world_size // tp, tp), ("dp", "tp")
    dim = {"tp": "tp", "pp": "pp", "ring": "cp", "moe": "ep"}.get(strategy, "dp")
    return (world_size,), (dim,)


def check_mesh(shape: tuple[int, ...], world_size: int) -> None:
    product = 1
    for size in shape:
        product *= size
    if product != world_size:
        raise ValueError(f"mesh {shape} has {product} ranks but the job runs on {world_size}")


def init_runtime(strategy: str, options: dict[str, Any]) -> RunContext:
    """Init the process group from torchrun's environment, pin the device, build the mesh."""
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if torch.cuda.is_available():
        device, backend = torch.device("cuda", local_rank), "nccl"
        torch.cuda.set_device(device)
    else:
        device, backend = torch.device("cpu"), "gloo"
        # N ranks share the host's cores: don't let each spawn a thread per core.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    dist.init_process_group(backend=backend, rank=rank, world_size=world, **({"device_id": device} if backend == "nccl" else {}))
    ctx = RunContext(rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world, device=device, backend=backend)
    if strategy != "collectives":
        shape, names = mesh_shape(strategy, world, options)
        check_mesh(shape, world)
        ctx.mesh = init_device_mesh(device.type, shape, mesh_dim_names=names)
    return ctx


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
