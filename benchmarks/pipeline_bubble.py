"""The pipeline bubble against its theory, (p−1)/(m+p−1): GPipe and 1F1B at m = 4 and 8, p = 2.

    python benchmarks/pipeline_bubble.py [--steps 5]

Each job runs as the worker runs it (`tests/workers/conftest.py`'s `make_job`/`run_job`: torchrun,
gloo, `tiny`, traced) and is merged by `workers.aggregate.build_result`; the table is read from the
result document: each stage's idle time within the step's window (first action on any stage to
the last on any, `parallab.core.metrics.pipeline_bubble`), their mean (the summary's
`bubble_fraction`), theory, and the stage imbalance (max/mean − 1 of the stages' busy time).
Prints a markdown table with the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from tests.workers.conftest import make_job, run_job

CASES = [("gpipe", 4), ("gpipe", 8), ("1f1b", 4), ("1f1b", 8)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} cores")
    print("| schedule, m | theory | stage 0 | stage 1 | mean | mean − theory | stage imbalance |")
    print("|---|---|---|---|---|---|---|")
    for schedule, m in CASES:
        job = make_job("pp", 2, {"schedule": schedule, "microbatches": m}, {"steps": args.steps, "global_batch_size": 16})
        with tempfile.TemporaryDirectory() as tmp:
            doc = run_job(job, Path(tmp) / "run", cache_dir=Path(tmp) / "cache")
        theory = (2 - 1) / (m + 2 - 1)
        stages = doc.summary.bubble_per_stage or []
        mean = doc.summary.bubble_fraction or 0.0
        cells = " | ".join(f"{b:.3f}" for b in stages)
        print(f"| {schedule}, {m} | {theory:.3f} | {cells} | {mean:.3f} | {mean - theory:+.3f} | {doc.summary.stage_imbalance or 0:.3f} |")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
