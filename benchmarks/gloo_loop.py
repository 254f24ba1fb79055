"""An independent gloo timing loop for benchmarks/collectives.py: torchrun runs it on N ranks.

    python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/gloo_loop.py OUT.json OP WARMUP ITERS SIZE [SIZE ...]

Nothing of parallab's harness: plain torch.distributed. For each size, a float32 buffer of
size / 4 elements (rounded down to a multiple of the world, as nccl-tests and the job do), WARMUP
untimed calls, a barrier, ITERS timed calls; the time of a size is the slowest rank's mean per
call. all_reduce, all_gather (into the full buffer), reduce_scatter and broadcast.
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    out, op, warmup, iters = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    sizes = [int(s) for s in sys.argv[5:]]
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    times = {}
    for size in sizes:
        numel = max(size // 4 // world, 1) * world
        full = torch.ones(numel)
        part = torch.ones(numel // world)
        call = {
            "all_reduce": lambda: dist.all_reduce(full),  # noqa: B023
            "all_gather": lambda: dist.all_gather_into_tensor(full, part),  # noqa: B023
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, full),  # noqa: B023
            "broadcast": lambda: dist.broadcast(full, src=0),  # noqa: B023
        }[op]
        for _ in range(warmup):
            call()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            call()
        elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times[numel * 4] = float(elapsed.item())
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump({str(k): v for k, v in times.items()}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
