"""A 2-rank gloo job doing known collectives under StepProfiler (launched by test_measure.py).

Per measured step: all_reduce of 1024 fp32 (4096 B), all_gather of 256 fp32 into 512 (2048 B),
reduce_scatter of 512 fp32 (2048 B), all_to_all of 256 fp32 (1024 B), one send and one recv of
128 fp32 (512 B each) through batch_isend_irecv. Writes the profiler's results per rank.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from pydantic import TypeAdapter

from workers.harness.measure import ProfileResult, StepProfiler


def main(out_dir: Path, steps: int, window: int) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    peer = (rank + 1) % world
    with StepProfiler(
        enabled=True, trace=True, rank=rank, world_size=world, out_dir=out_dir, device=torch.device("cpu"), window=window
    ) as prof:
        for _ in range(steps):
            x = torch.full((1024,), float(rank + 1))
            dist.all_reduce(x)
            gathered = torch.empty(256 * world)
            dist.all_gather_into_tensor(gathered, torch.ones(256))
            shard = torch.empty(512 // world)
            dist.reduce_scatter_tensor(shard, torch.ones(512))
            exchanged = torch.empty(256)
            dist.all_to_all_single(exchanged, torch.ones(256))
            inbox = torch.empty(128)
            for work in dist.batch_isend_irecv(
                [dist.P2POp(dist.isend, torch.ones(128), peer), dist.P2POp(dist.irecv, inbox, (rank - 1) % world)]
            ):
                work.wait()
            _ = torch.randn(64, 64) @ torch.randn(64, 64)
            assert x[0].item() == sum(range(1, world + 1))
            prof.step()
    (out_dir / f"result_rank{rank}.json").write_bytes(TypeAdapter(ProfileResult).dump_json(prof.results()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
