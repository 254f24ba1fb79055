"""2-rank gloo driver for test_collectives.py: a small sweep, each rank writes its points as JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from parallab.core.strategies.collectives import ALL_OPS, CollectivesOptions
from workers.harness.collectives import run_collectives

if __name__ == "__main__":
    dist.init_process_group("gloo")
    options = CollectivesOptions(ops=list(ALL_OPS), min_bytes=1024, max_bytes=int(sys.argv[2]), iters=3, warmup_iters=1)
    points = run_collectives(dist.get_rank(), dist.get_world_size(), torch.device("cpu"), options)
    Path(sys.argv[1], f"points_rank{dist.get_rank()}.json").write_text(json.dumps([p.model_dump() for p in points]))
    dist.destroy_process_group()
