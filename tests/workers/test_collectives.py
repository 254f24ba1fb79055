"""The nccl-tests-style sweep on a real 2-rank gloo job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parallab.core.metrics import busbw_factor
from parallab.core.result import CollectivePoint
from workers.harness.collectives import sizes

DRIVER = Path(__file__).with_name("collectives_driver.py")
REPO = Path(__file__).resolve().parents[2]
OPS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"]


def test_sizes_double_from_min_to_max():
    assert sizes(1024, 8192) == [1024, 2048, 4096, 8192]
    assert sizes(1024, 3000) == [1024, 2048]


@pytest.mark.slow
def test_sweep_on_two_ranks(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(DRIVER), str(tmp_path), "8192"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"points_rank{r}.json").read_text()) for r in range(2)]
    assert [(p["op"], p["size_bytes"]) for p in ranks[0]] == [(op, s) for op in OPS for s in (1024, 2048, 4096, 8192)]
    assert [p["time_s"] for p in ranks[0]] == [p["time_s"] for p in ranks[1]]  # the slowest rank's time, everywhere
    for point in ranks[0]:
        CollectivePoint.model_validate(point)
        assert point["time_s"] > 0
        assert point["algbw_gbps"] == pytest.approx(point["size_bytes"] / point["time_s"] / 1e9)
        assert point["busbw_gbps"] == pytest.approx(point["algbw_gbps"] * busbw_factor(point["op"], 2))
