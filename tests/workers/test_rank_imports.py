"""What a rank pays at start: every rank of every run (and of every test launch) imports the
harness first, so a module it drags in without using costs CPU on every process start.

`torch.distributed._tools`' package `__init__` imports its runtime estimator, hence TorchDynamo
and Inductor (about 2.5 s of CPU a rank); the harness loads the trackers it uses without it
(`workers.harness.torchtools`). Checked in a fresh interpreter, as a rank starts.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.workers.conftest import REPO, torchrun_env

UNUSED = ("torch._dynamo", "torch._inductor")
"""Modules a rank of a plain (not compiled) run never uses."""

PROBE = f"""
import json, sys
import workers.harness.main
before = [m for m in {UNUSED!r} if m in sys.modules]
from workers.harness.memwatch import MemTracker, ModTracker
from torch.distributed._tools import RuntimeEstimator, FSDPMemTracker
import torch.distributed._tools as tools
print(json.dumps({{
    "imported": before,
    "trackers": [MemTracker.__module__, ModTracker.__module__],
    "package": [RuntimeEstimator.__name__, FSDPMemTracker.__name__, tools.MemTracker is MemTracker],
}}))
"""


def test_a_rank_starts_without_torchdynamo_and_the_tools_package_still_answers_for_its_names() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, env=torchrun_env(), capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["imported"] == [], f"the harness imports {seen['imported']} at start: seconds of CPU on every rank"
    assert seen["trackers"] == ["torch.distributed._tools.mem_tracker", "torch.distributed._tools.mod_tracker"]
    # whoever asks the package itself for a name gets the real package
    assert seen["package"] == ["RuntimeEstimator", "FSDPMemTracker", True]
