"""Collectives on CUDA tensors with one GPU: what a one-device host can show of the comm path.

    python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/gpu_collectives.py --backend gloo --out F.json
    python -m torch.distributed.run --standalone --nproc-per-node 1 benchmarks/gpu_collectives.py --backend nccl --out F.json

NCCL gives one rank per GPU, so on one GPU it runs a world of one (every collective is a local
copy: it proves the NCCL group, the `device_id` binding and the calls, not a link). Gloo takes
CUDA tensors (it stages them through host memory), so two ranks can share the one GPU over gloo:
that is what parallab's sweep (`workers.harness.collectives`, the `collectives` job kind) runs here, with
every call's result checked, not only timed. Rank 0 writes the points and the check as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from parallab.core.interconnect import CollectivesOptions  # noqa: E402
from workers.harness.collectives import run_collectives  # noqa: E402


def checked(world: int, rank: int, device: torch.device) -> dict[str, bool]:
    """Each op once on a known buffer, its result compared with the arithmetic it must give."""
    ones = torch.full((world * 4,), float(rank + 1), device=device)
    total = world * (world + 1) / 2
    out: dict[str, bool] = {}
    buf = ones.clone()
    dist.all_reduce(buf)
    out["all_reduce"] = bool(torch.all(buf == total))
    gathered = torch.empty(world * 4, device=device)
    dist.all_gather_into_tensor(gathered, torch.full((4,), float(rank + 1), device=device))
    out["all_gather"] = bool(torch.equal(gathered, torch.arange(1, world + 1, device=device, dtype=torch.float32).repeat_interleave(4)))
    shard = torch.empty(4, device=device)
    dist.reduce_scatter_tensor(shard, ones)
    out["reduce_scatter"] = bool(torch.all(shard == total))
    a2a = torch.empty_like(ones)
    dist.all_to_all_single(a2a, ones)
    out["all_to_all"] = bool(torch.equal(a2a, torch.arange(1, world + 1, device=device, dtype=torch.float32).repeat_interleave(4)))
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=("gloo", "nccl"), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-bytes", type=int, default=64 * 1024 * 1024)
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    kwargs = {"device_id": device} if args.backend == "nccl" else {}
    dist.init_process_group(args.backend, rank=rank, world_size=world, **kwargs)
    try:
        check = checked(world, rank, device)
        ops = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"] if world > 1 else ["all_reduce", "all_gather"]
        options = CollectivesOptions(ops=ops, min_bytes=1 << 20, max_bytes=args.max_bytes, iters=5, warmup_iters=2)
        points = run_collectives(rank, world, device, options)
        if rank == 0:
            doc = {
                "backend": args.backend,
                "world_size": world,
                "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                "tensors_on": device.type,
                "checks": check,
                "points": [p.model_dump() for p in points],
            }
            args.out.write_text(json.dumps(doc, indent=1))
    finally:
        dist.destroy_process_group()
    return 0 if all(check.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
