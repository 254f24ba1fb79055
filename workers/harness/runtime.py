"""Device, backend, process group and device mesh of one rank — passed around, never global.

CUDA available → NCCL, one rank per GPU by LOCAL_RANK; otherwise CPU ranks on gloo. The mesh is
the job's (`ResolvedJob.mesh`, from its strategy descriptor), built with the rank's own device
type ("cpu" on CPU: FSDP2 over gloo with a cuda mesh crashes); job kinds without a mesh (the
collectives sweep) run on the default process group.
"""

from __future__ import annotations

import gc
import math
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from parallab.core.jobs import ResolvedJob
from parallab.core.spec import Precision


@dataclass(frozen=True)
class RunContext:
    """What a rank knows about where it runs, built once by `init_runtime` and never changed
    (a variant, such as the reference run's one-process context, is a `dataclasses.replace`)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str
    """"nccl", "gloo", or "none" for a context that talks to nobody (the reference run)."""
    accum_steps: int = 1
    """Gradient-accumulation micro-steps per optimizer step (the workload's recipe)."""
    precision: Precision = "fp32"
    mesh: DeviceMesh | None = None
    """The job's mesh: its layout's dims of degree above one, named by `parallab.core.layout.MeshAxisName`
    (("dp_shard", "tp") for hybrid); None without one."""

    @property
    def is_lead(self) -> bool:
        return self.rank == 0

    def synchronize(self) -> None:
        """Wait for queued device work so a clock read means the step is done."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def mesh_dim(self, name: str) -> DeviceMesh:
        """The 1-D mesh of dim `name` (the whole mesh when it is 1-D); an error naming the dims otherwise."""
        names = (self.mesh.mesh_dim_names or ()) if self.mesh is not None else ()
        if self.mesh is None or name not in names:
            raise RuntimeError(f"this rank's mesh has no {name!r} dim (dims: {', '.join(names) or 'none'})")
        return self.mesh[name] if self.mesh.ndim > 1 else self.mesh


def init_runtime(job: ResolvedJob) -> RunContext:
    """Init the process group from torchrun's environment, pin the device, build the job's mesh."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    # torchrun's global rank is where this process sits (node × ranks per node + local rank); the
    # placement's order says which mesh rank runs there (`inner-first`: the same one).
    rank = job.mesh_rank(int(os.environ.get("RANK", "0"))) if world == job.world_size else int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if world != job.world_size:
        raise RuntimeError(f"the job runs on {job.world_size} rank(s) but torchrun started {world}")
    shape = tuple(dim.size for dim in job.mesh)
    if shape and math.prod(shape) != world:
        raise RuntimeError(f"mesh {job.mesh} has {math.prod(shape)} ranks but the job runs on {world}")
    if torch.cuda.is_available():
        device, backend = torch.device("cuda", local_rank), "nccl"
        torch.cuda.set_device(device)
    else:
        device, backend = torch.device("cpu"), "gloo"
        # N ranks share the host's cores: don't let each spawn a thread per core.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    # The worker's collective timeout (PARALLAB_COLLECTIVE_TIMEOUT_S): a peer cut off fails the
    # world group's collectives in that time, not torch's 30 minutes.
    said = os.environ.get("PARALLAB_COLLECTIVE_TIMEOUT_S")
    timeout = timedelta(seconds=float(said)) if said else None
    if backend == "nccl":
        dist.init_process_group(backend=backend, rank=rank, world_size=world, device_id=device, timeout=timeout)
    else:
        dist.init_process_group(backend=backend, rank=rank, world_size=world, timeout=timeout)
    mesh = init_device_mesh(device.type, shape, mesh_dim_names=tuple(dim.name for dim in job.mesh)) if shape else None
    return RunContext(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        local_world_size=local_world,
        device=device,
        backend=backend,
        accum_steps=job.accum_steps,
        precision=job.workload.precision,
        mesh=mesh,
    )


def shutdown() -> None:
    """Leave the process group. What still holds a group (a wrapped model in a reference cycle)
    is collected first, while the interpreter is whole: gloo's worker threads destroyed during
    interpreter shutdown can abort the rank."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
