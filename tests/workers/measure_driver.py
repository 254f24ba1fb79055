"""A 2-rank gloo job doing known collectives in StepProfiler's window (launched by test_measure.py).

Per step: a small linear layer's forward, backward and AdamW step (so MemTracker has parameters,
gradients and optimizer state to split), an all_reduce of 1024 fp32 (4096 B), all_gather of 256
fp32 into 512 (2048 B), reduce_scatter of 512 fp32 (2048 B), all_to_all of 256 fp32 (1024 B), one
send and one recv of 128 fp32 (512 B each) through batch_isend_irecv. Writes the profiler's
results per rank, with the layer's parameter bytes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from pydantic import TypeAdapter

from workers.harness.measure import ProfileResult, StepProfiler

FEATURES = 32


def main(out_dir: Path, window: int) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    peer = (rank + 1) % world
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, FEATURES)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(_: int) -> None:
        optimizer.zero_grad(set_to_none=True)
        model(torch.randn(16, FEATURES)).square().mean().backward()
        optimizer.step()
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

    prof = StepProfiler(rank=rank, world_size=world, out_dir=out_dir, device=torch.device("cpu"), window=window)
    step(-1)  # the optimizer's state exists before the window, as after a training run's timed steps
    prof.run(step, model=model, optimizer=optimizer, synchronize=lambda: None)
    result = TypeAdapter(ProfileResult).dump_json(prof.results())
    (out_dir / f"result_rank{rank}.json").write_bytes(result)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    (out_dir / f"params_rank{rank}.txt").write_text(str(params))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
