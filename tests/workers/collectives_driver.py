"""2-rank gloo driver for test_collectives.py: a small sweep, rank 0 writes the points as JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from workers.harness.collectives import run_collectives

if __name__ == "__main__":
    dist.init_process_group("gloo")
    options = {"ops": ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"],
               "min_bytes": 1024, "max_bytes": int(sys.argv[2]), "iters": 3, "warmup_iters": 1}
    points = run_collectives(dist.get_rank(), dist.get_world_size(), torch.device("cpu"), options)
    Path(sys.argv[1], f"points_rank{dist.get_rank()}.json").write_text(json.dumps(points))
    dist.destroy_process_group()
