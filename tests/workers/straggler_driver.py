"""A 4-rank gloo job on a 2 × 2 mesh (dp_shard, tp) profiled by StepProfiler, once with a delay
injected on one rank and then several times clean (launched by test_stragglers.py).

Each profiled step: a small matmul, then per round an all_reduce on the rank's tp group, on the
world, on its dp_shard group and on the world again. In the delayed window, rank `--late` sleeps
`--delay-ms` before every collective, all on the world (so each wait is one delay: with a subgroup
between, a rank outside it would wait for two) — the fault is injected here, in the test's
driver, never in the harness. Each
window's per-rank `collective_times` are written as `arrivals_<phase>_rank<r>.json`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from workers.harness.measure import StepProfiler

ROUNDS = 2


def window(out: Path, phase: str, *, late: int, delay_s: float, mesh: object) -> None:
    rank = dist.get_rank()
    groups = [mesh.get_group("tp"), None, mesh.get_group("dp_shard"), None] if late < 0 else [None] * 4  # type: ignore[attr-defined]

    def step(_: int) -> None:
        _ = torch.randn(64, 64) @ torch.randn(64, 64)
        for _round in range(ROUNDS):
            for group in groups:
                if rank == late:
                    time.sleep(delay_s)
                dist.all_reduce(torch.ones(256), group=group)

    prof = StepProfiler(rank=rank, world_size=dist.get_world_size(), out_dir=out / phase, device=torch.device("cpu"), window=3)
    prof.run(step, model=torch.nn.Linear(2, 2), optimizer=torch.optim.SGD(torch.nn.Linear(2, 2).parameters()), synchronize=lambda: None)
    times = prof.results().collective_times
    doc = None if times is None else [g.model_dump() for g in times]
    (out / f"arrivals_{phase}_rank{rank}.json").write_text(json.dumps({"steps": prof.results().profiled_steps, "arrivals": doc}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--late", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("--clean", type=int, default=5, help="Clean windows after the delayed one.")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
    window(args.out, "late", late=args.late, delay_s=args.delay_ms / 1e3, mesh=mesh)
    for i in range(args.clean):
        window(args.out, f"clean{i}", late=-1, delay_s=0.0, mesh=mesh)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
