"""The pipeline bubble against its theory: GPipe and 1F1B, (p−1)/(m+p−1), at m = 4 and 8, p = 2;
interleaved 1F1B with v = 2 virtual stages a rank, (p−1)/(v·m+p−1), at the same p and m.

    python benchmarks/pipeline_bubble.py [--steps 5] [--model tiny|small] [--cases gpipe:4,1f1b:8,interleaved_1f1b:4:2] [--set seq_len=512]

A case is schedule:m or schedule:m:v (v virtual stages a rank; the model's layers must divide
into 2·v stages). Theory is the schedule's formula (`parallab.core.dims.pp.bubble`); with v > 1
each column "rank r" is the rank's idle over its chunks together.

Each job runs as the worker runs it (`tests/workers/conftest.py`'s `make_job`/`run_job`: torchrun,
gloo, `tiny`, traced) and is merged by `workers.aggregate.build_result`; the table is read from the
result document: each stage's idle time within the step's window (first action on any stage to
the last on any, `parallab.core.metrics.pipeline_bubble`), their mean (the summary's
`bubble_fraction`), theory, and the stage imbalance (max/mean − 1 of the stages' busy time).
Prints a markdown table with the load average before and after. `--set field=value` overrides a
workload field (e.g. a longer sequence, so each action is longer against the schedule's fixed cost
per action: the P2P hand-off and the dispatch, which the formula takes as free).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from parallab.core.dims.pp import bubble as schedule_bubble
from parallab.core.layout import Layout
from parallab.core.metrics import rank_bubbles, unequal_stages_bubble
from tests.workers.conftest import make_job, run_job

CASES = [("gpipe", 4, 1), ("gpipe", 8, 1), ("1f1b", 4, 1), ("1f1b", 8, 1), ("interleaved_1f1b", 4, 2), ("interleaved_1f1b", 8, 2)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--model", default="tiny", help="a model preset")
    parser.add_argument(
        "--cases", default=",".join(f"{s}:{m}:{v}" for s, m, v in CASES), help="schedule:microbatches[:virtual stages], comma-separated"
    )
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="a workload field override (repeatable)")
    args = parser.parse_args()
    overrides = {k: int(v) if v.isdigit() else v for k, _, v in (o.partition("=") for o in args.set)}
    cases = [(c.split(":")[0], int(c.split(":")[1]), int((c.split(":") + ["1"])[2])) for c in args.cases.split(",")]
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"model {args.model} {overrides or ''}; load average before: {load}, {os.cpu_count()} cores")
    columns = ["theory", "rank 0", "rank 1", "mean", "mean − theory", "stage imbalance", "theory, measured stages", "mean − that"]
    print(f"| schedule, m, v | {' | '.join(columns)} | mean action |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for schedule, m, v in cases:
        workload = {"model": args.model, "steps": args.steps, "global_batch_size": 16, **overrides}
        job = make_job("pp", 2, {"schedule": schedule, "microbatches": m, "virtual_stages": v}, workload)
        with tempfile.TemporaryDirectory() as tmp:
            doc = run_job(job, Path(tmp) / "run", cache_dir=Path(tmp) / "cache")
        theory = schedule_bubble(Layout(pp=2, microbatches=m, virtual_stages=v, schedule=schedule))[0]  # type: ignore[arg-type]
        stages = doc.summary.bubble_per_stage or []
        mean = doc.summary.bubble_fraction or 0.0
        cells = " | ".join(f"{b:.3f}" for b in stages)
        actions = [b - a for r in doc.ranks for step in r.pipeline_actions_us or [] for a, b in step]
        action_ms = sum(actions) / len(actions) / 1000 if actions else 0.0
        imbalance = doc.summary.stage_imbalance or 0.0
        bubble = rank_bubbles([r.model_dump(mode="json") for r in doc.ranks])
        # the unequal-stages formula is one stage a rank's: not a reading of interleaving
        unequal = unequal_stages_bubble(bubble.busy_per_stage, m) if bubble and v == 1 else float("nan")
        print(
            f"| {schedule}, {m}, {v} | {theory:.3f} | {cells} | {mean:.3f} | {mean - theory:+.3f} | {imbalance:.3f} "
            f"| {unequal:.3f} | {mean - unequal:+.3f} | {action_ms:.2f} ms |"
        )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
