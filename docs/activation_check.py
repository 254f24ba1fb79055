"""Print the activation prediction beside what autograd saves (the table in docs/theory.md).

One forward of the workload model on one process under `saved_tensors_hooks`, against
`parallab.core.prediction` (tests/core/test_activations.py holds the same check to 1%). Run from
the repository root:

    PYTHONPATH=$PWD python docs/activation_check.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.core.test_activations import autograd_saved_bytes, job  # noqa: E402

CASES = [
    {},
    {"precision": "bf16"},
    {"num_experts": 4},
    {"num_experts": 4, "precision": "bf16"},
    {"model": "small"},
    {"model": "small", "precision": "bf16"},
]

if __name__ == "__main__":
    print("| workload | predicted (kept) | autograd saved | saved / predicted |")
    print("|---|---:|---:|---:|")
    for case in CASES:
        predicted, saved = autograd_saved_bytes(job("single", 1, **case))
        label = ", ".join(f"{k}={v}" for k, v in {"model": "tiny", **case}.items())
        print(f"| {label} | {predicted:,} | {saved:,} | {saved / predicted:.4f} |")
